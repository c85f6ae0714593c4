"""The serving path of the task heads: pairs and texts through a dynamic batcher of
their own (packed like any sequences, token types riding along), token-level outputs on a
worker thread."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from zoi.errors import InputError
from zoi.serve.batcher import Batcher
from zoi.serve.http import ApiError

HEAD_ROUTES = {
    "seq_cls": "/rerank, /predict, /v1/rerank, /v2/rerank",
    "token_cls": "/predict_tokens",
    "splade": "/embed_sparse",
    "": "/embed, /embed_all, /v1/embeddings",
}


class Seq:
    """One sequence for the head batcher: token ids and their types (pairs)."""

    __slots__ = ("ids", "types")

    def __init__(self, ids: np.ndarray, types: np.ndarray | None):
        self.ids, self.types = ids, types

    def __len__(self) -> int:
        return len(self.ids)


def need(svc, route: str, *heads: str) -> None:
    """400 naming the model's head when the route needs another one."""
    h = getattr(svc.engine, "head", "")
    if h not in heads:
        from zoi.heads import HEAD_NAMES
        from zoi.heads.names import a_

        want = " or ".join(HEAD_NAMES[x] for x in heads)
        raise ApiError(
            "invalid",
            f"{route} needs {a_(want)} model; {svc.model_name} is {a_(HEAD_NAMES[h])} model "
            f"(its routes: {routes_text(svc.engine, h)})",
        )


def routes_text(engine, h: str) -> str:
    """The routes a model answers, for the messages: its head's, and its multi-vector ones
    (a ColBERT model has no embedding routes)."""
    from zoi.serve.openapi_heads import multivector_routes

    mv = getattr(engine, "multivector", None)
    base = "/embed_all" if mv is not None and mv.kind == "colbert" else HEAD_ROUTES[h]
    return ", ".join([base, *multivector_routes(engine)])


class HeadJobs:
    """The head batcher of a Service whose engine has a seq_cls or splade head."""

    def __init__(self, svc):
        self.svc = svc
        eng = svc.engine
        self.offset = int(eng.spec.position_offset)
        args = (
            eng.head_cols,
            svc.max_batch_tokens,
            svc.max_batch_requests,
            svc.config.max_queue_delay_us,
            svc.metrics,
        )
        if getattr(svc, "replicated", False):  # several engines (zoi.serve.replicas)
            import functools

            from zoi.serve.replicas import ReplicaBatcher

            runs = [functools.partial(self._run, engine=e) for e in svc.engines]
            self.batcher = ReplicaBatcher(runs, *args, names=svc.engine_names, name="zoi-heads")
        else:
            self.batcher = Batcher(self._run, *args, name="zoi-heads")

    def _run(self, seqs: list[Seq], engine=None) -> np.ndarray:
        lens = np.fromiter((len(s) for s in seqs), np.int32, len(seqs))
        cu = np.zeros(len(seqs) + 1, np.int32)
        np.cumsum(lens, out=cu[1:])
        ids = np.concatenate([s.ids for s in seqs]).astype(np.int32)
        types = None
        if any(s.types is not None for s in seqs):
            types = np.concatenate(
                [s.types if s.types is not None else np.zeros(len(s), np.int32) for s in seqs]
            ).astype(np.int32)
        pos = (np.arange(len(ids), dtype=np.int32) - np.repeat(cu[:-1], lens) + self.offset).astype(
            np.int32
        )
        return (engine or self.svc.engine).run_head_packed(ids, pos, cu, types)

    def close(self) -> None:
        self.batcher.close()

    # ---- tokenising -----------------------------------------------------------------------
    async def pair_seqs(self, pairs: list[tuple[str, str]], strategy="longest_first"):
        eng = self.svc.engine
        limit = self.svc.max_positions

        def work():
            return eng._pairs().encode(pairs, limit, strategy)

        t0 = time.perf_counter()
        try:
            ids, _, types, cu = await self.svc.run_in_tokenizer_thread(work)
        except InputError as e:
            raise ApiError("invalid", str(e)) from None
        keep = "types" in eng.model.graph.inputs
        seqs = [
            Seq(ids[cu[i] : cu[i + 1]], types[cu[i] : cu[i + 1]] if keep else None)
            for i in range(len(pairs))
        ]
        return seqs, time.perf_counter() - t0

    async def text_seqs(self, texts: list[str], truncate: bool):
        seqs, dt = await self.svc.tokenize(texts, truncate)
        return [Seq(s, None) for s in seqs], dt

    async def run(self, request, seqs: list[Seq], tok_s: float, t0: float):
        return await self.svc.embed(request, seqs, False, tok_s, t0, batcher=self.batcher)


async def in_thread(fn, *args):
    """Token-level outputs (no row per sequence to batch by): the engine on a worker thread."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
    except InputError as e:
        raise ApiError("too_large", str(e)) from None
