"""What runs inside a Triton Python-backend instance (model.py calls it); no Triton import here.

`BatchRunner.run` takes the texts of every request of one dynamic batch and makes one packed
engine call over all of them (the engine itself splits it in chunks of its max_tokens). A
request whose input is unusable gets its own error and the others still run; when the packed
call fails, each request is retried alone so only the one that fails by itself gets the error
(zoi.serve.isolate.run_isolated: the rule the batcher of `zoi serve` uses).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from zoi.serve.isolate import run_isolated

log = logging.getLogger("zoi.triton")


class RequestError(ValueError):
    """The request itself is unusable (empty text, bad UTF-8, over the length cap)."""


def _bool(s: str | None, default: bool) -> bool:
    if s is None or s == "":
        return default
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {s!r}")


def decode_texts(arr: np.ndarray) -> list[str]:
    """A BYTES tensor ([n] or [n, 1], object array of bytes) -> n strings, checked."""
    flat = np.asarray(arr, dtype=object).reshape(-1)
    out = []
    for i, b in enumerate(flat):
        if isinstance(b, str):
            t = b
        else:
            try:
                t = bytes(b).decode("utf-8")
            except UnicodeDecodeError as e:
                raise RequestError(f"TEXT[{i}] is not valid UTF-8 ({e})") from None
        if not t:
            raise RequestError(f"TEXT[{i}] is an empty string; send non-empty text")
        out.append(t)
    if not out:
        raise RequestError("TEXT is empty; send at least one text")
    return out


class BatchRunner:
    def __init__(
        self,
        engine,
        normalize: bool | None = None,
        truncate: bool = True,
        max_input_chars: int | None = None,
    ):
        from zoi.frontend.tokenizer import pack

        self.engine = engine
        self.normalize = engine.spec.normalize if normalize is None else bool(normalize)
        self.truncate = bool(truncate)
        self.max_input_chars = int(max_input_chars or 32 * engine.spec.max_positions)
        self.hidden = int(engine.spec.hidden)
        self._pack = pack
        self.calls = 0  # packed engine calls (one per execute batch, plus retries)

    def _tokenize(self, texts: list[str]):
        for i, t in enumerate(texts):
            if len(t) > self.max_input_chars:
                raise RequestError(
                    f"TEXT[{i}] has {len(t)} characters, over the cap of {self.max_input_chars}"
                )
        from zoi.errors import InputError

        try:
            return self.engine.tokenizer.encode_ids(texts, self.truncate)
        except InputError as e:
            raise RequestError(str(e)) from None

    def _run(self, seqs: list[np.ndarray]) -> np.ndarray:
        ids, pos, cu = self._pack(seqs, self.engine.spec.position_offset)
        self.calls += 1
        return self.engine.run_packed(ids, pos, cu, self.normalize)

    def run(self, batch: list[np.ndarray | list[str]]) -> list[np.ndarray | Exception]:
        """One entry per request: float32 [n_i, H] embeddings, or the exception for that request."""
        results: list = [None] * len(batch)
        seqs_of: list = [None] * len(batch)
        for r, item in enumerate(batch):
            try:
                texts = item if isinstance(item, list) else decode_texts(item)
                seqs_of[r] = self._tokenize(texts)
            except (RequestError, ValueError) as e:
                results[r] = e
        live = [r for r in range(len(batch)) if results[r] is None]
        if not live:
            return results

        def after_packed(seqs: list, dt: float, failed: Exception | None) -> None:
            if failed is not None:
                log.warning(
                    "zoi: packed call over %d requests failed (%s); retrying each alone",
                    len(live),
                    failed,
                )

        def deliver(i: int, rows, error, dt: float) -> None:
            results[live[i]] = rows if error is None else error

        # the server's rule: one packed call; when it fails, each request alone
        run_isolated([seqs_of[r] for r in live], self._run, deliver, after_packed=after_packed)
        return results


def instance_device(params: dict[str, str], instance_kind: str, device_id) -> str:
    """The device of one Triton instance: `cuda:<model_instance_device_id>` for a KIND_GPU
    instance (an instance group per GPU: each instance's engine on its own GPU), else the
    CPU; the config parameter zoi_device overrides ('cuda' takes the instance's GPU)."""
    device = params.get("zoi_device") or ""
    gpu = str(instance_kind).upper() == "GPU"
    if not device:
        device = "cuda" if gpu else "cpu"
    if device == "cuda":
        try:
            index = int(device_id or 0)
        except (TypeError, ValueError):
            raise ValueError(f"model_instance_device_id {device_id!r} is not a GPU id") from None
        device = f"cuda:{index}"
    return device


def open_runner(
    model_dir: str | os.PathLike,
    params: dict[str, str],
    instance_kind: str,
    device_id: int | str | None,
) -> BatchRunner:
    """Load the artifact an exported repository names, on this instance's device."""
    import zoi

    art = Path(params.get("zoi_artifact") or "artifact")
    if not art.is_absolute():
        art = Path(model_dir) / art
    device = instance_device(params, instance_kind, device_id)
    max_tokens = int(params["zoi_max_tokens"]) if params.get("zoi_max_tokens") else None
    engine = zoi.load(art, device=device, max_tokens=max_tokens)
    normalize = params.get("zoi_normalize")
    runner = BatchRunner(
        engine,
        normalize=None if not normalize else _bool(normalize, True),
        truncate=_bool(params.get("zoi_truncate"), True),
    )
    log.info(
        "zoi: %r on %s (instance kind %s, device id %s)", engine, device, instance_kind, device_id
    )
    return runner
