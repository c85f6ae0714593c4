"""Several engines behind one server: the dispatcher of zoi.serve.replicas.

It is device-agnostic, so everything the GPUs run (`--gpus 0,1`) is checked here on CPU
engines (`--replicas 2`): batches spread over the engines (both run at once under load),
rows come back in request order, one engine failing fails only its batches (with an error
naming it) while the others and the server carry on, shutdown answers everything queued.
No timing assertions: concurrency is proven with barriers (generous timeouts only).
"""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

from zoi.serve.batcher import BatcherClosed
from zoi.serve.config import ServeConfig
from zoi.serve.metrics import Metrics
from zoi.serve.replicas import EngineError, EnginePlan, ReplicaBatcher, plan_engines

from .serve_helpers import cosine_rows, metric, mixed_texts

H = 4


def row(seq: np.ndarray) -> np.ndarray:
    return np.array([len(seq), seq.sum(), seq[0], seq[-1]], np.float32)


class Lane:
    """A fake engine: records its calls; may hold them on a gate, meet the other lanes at a
    barrier on its first call, or fail while `broken` is set."""

    def __init__(self, name, barrier=None):
        self.name = name
        self.calls: list[list[int]] = []  # first token of each sequence of each call
        self.gate = threading.Event()
        self.gate.set()
        self.barrier = barrier
        self.broken = threading.Event()
        self.entered = threading.Event()  # set once a call has started (then held at the gate)
        self.threads: set[str] = set()

    def __call__(self, seqs):
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.barrier is not None:
            b, self.barrier = self.barrier, None
            b.wait(30)  # BrokenBarrierError when the other engine never runs at the same time
        self.gate.wait(30)
        self.calls.append([int(s[0]) for s in seqs])
        if self.broken.is_set():
            raise RuntimeError(f"simulated device fault on {self.name}")
        return np.stack([row(s) for s in seqs])


def seqs_of(lengths, start):
    return [
        np.arange(start + 100 * i, start + 100 * i + n, dtype=np.int32)
        for i, n in enumerate(lengths)
    ]


def expect(seqs, normalize):
    out = np.stack([row(s) for s in seqs])
    if normalize:
        out = out / np.linalg.norm(out, axis=1, keepdims=True)
    return out


async def gather_jobs(jobs):
    out = []
    for j in jobs:
        try:
            out.append(await j.future)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out.append(e)
    return out


def test_batches_spread_over_idle_engines_both_run_at_once():
    barrier = threading.Barrier(2)
    lanes = [Lane("cpu:0", barrier), Lane("cpu:1", barrier)]
    m = Metrics()
    b = ReplicaBatcher(lanes, H, max_batch_tokens=64, max_batch_requests=2, metrics=m,
                       names=["cpu:0", "cpu:1"])  # fmt: skip

    async def main():
        jobs = [b.submit(seqs_of([3, 5, 2], 10_000 * k), normalize=k % 2 == 0) for k in range(12)]
        return jobs, await gather_jobs(jobs)

    jobs, outs = asyncio.run(main())
    b.close()
    # each engine's first call waited at the barrier for the other's: both ran at once
    assert all(len(ln.calls) > 0 for ln in lanes)
    for k, (j, o) in enumerate(zip(jobs, outs, strict=True)):
        assert not isinstance(o, Exception), o
        np.testing.assert_allclose(o, expect(seqs_of([3, 5, 2], 10_000 * k), k % 2 == 0), rtol=1e-6)
        assert j.queue_s >= 0 and j.infer_s > 0
    # every sequence computed exactly once, over both engines; one worker thread per engine
    firsts = sorted(x for ln in lanes for c in ln.calls for x in c)
    assert firsts == sorted(10_000 * k + 100 * i for k in range(12) for i in range(3))
    assert len(lanes[0].threads | lanes[1].threads) == 2
    assert lanes[0].threads.isdisjoint(lanes[1].threads)
    info = b.engines_info()
    assert [i["device"] for i in info] == ["cpu:0", "cpu:1"]
    assert sum(i["sequences"] for i in info) == 36 and all(i["batches"] > 0 for i in info)
    assert all(i["state"] == "stopped" for i in info)
    text = m.render()[0].decode()
    for i in (0, 1):
        lab = f'device="cpu:{i}",engine="{i}"'
        assert metric(text, "zoi_engine_batches_total", lab) == info[i]["batches"]
        assert metric(text, "zoi_engine_sequences_total", lab) == info[i]["sequences"]
    assert metric(text, "zoi_batch_size_count") == info[0]["batches"] + info[1]["batches"]


def test_a_request_split_over_engines_gets_its_rows_in_order():
    lanes = [Lane("a"), Lane("b"), Lane("c")]
    for ln in lanes:
        ln.gate.clear()  # hold every engine: the first three batches go to three engines
    b = ReplicaBatcher(lanes, H, max_batch_tokens=12, max_batch_requests=3)
    lens = [5, 1, 7, 3, 3, 12, 2, 2, 2, 9, 4, 1, 1, 6]

    async def main():
        big = b.submit(seqs_of(lens, 7), normalize=True)
        small = [b.submit(seqs_of([2, 3], 50_000 + 1000 * k), normalize=False) for k in range(4)]
        for ln in lanes:  # each engine holds a batch: the queue held more than three
            assert ln.entered.wait(30), f"engine {ln.name} never took a batch"
        for ln in lanes:
            ln.gate.set()
        return big, await gather_jobs([big, *small])

    big, outs = asyncio.run(main())
    b.close()
    np.testing.assert_allclose(outs[0], expect(seqs_of(lens, 7), True), rtol=1e-6)
    for k, o in enumerate(outs[1:]):
        np.testing.assert_array_equal(o, expect(seqs_of([2, 3], 50_000 + 1000 * k), False))
    # the big request's sequences ran on more than one engine, and no batch broke a budget
    big_firsts = {7 + 100 * i for i in range(len(lens))}
    used = [ln for ln in lanes if any(x in big_firsts for c in ln.calls for x in c)]
    assert len(used) >= 2


def test_one_engine_failing_fails_only_its_batches_and_names_it():
    good, bad = Lane("cpu:0"), Lane("cpu:1")
    good.gate.clear()
    bad.gate.clear()
    bad.broken.set()
    b = ReplicaBatcher([good, bad], H, max_batch_tokens=100, max_batch_requests=2,
                       metrics=Metrics(), names=["cpu:0", "cpu:1"])  # fmt: skip

    async def main():
        jobs = [b.submit(seqs_of([4], 1000 * k), normalize=False) for k in range(10)]
        for ln in (good, bad):  # each engine holds a batch
            assert ln.entered.wait(30), f"engine {ln.name} never took a batch"
        good.gate.set()
        bad.gate.set()
        outs = await gather_jobs(jobs)
        bad.broken.clear()  # the engine recovers: the server kept serving throughout
        later = [b.submit(seqs_of([3, 3], 90_000 + 1000 * k), normalize=False) for k in range(6)]
        return outs, await gather_jobs(later)

    outs, later = asyncio.run(main())
    info = b.engines_info()
    b.close()
    on_bad = {x // 1000 for c in bad.calls for x in c if x < 90_000}  # jobs that ran on cpu:1
    assert on_bad, "the held engines should each have taken a batch"
    for k, o in enumerate(outs):
        if k in on_bad:
            assert isinstance(o, EngineError), o
            assert str(o).startswith("cpu:1 (engine 1 of 2): simulated device fault on cpu:1")
            assert o.engine == 1 and o.device == "cpu:1"
        else:
            np.testing.assert_array_equal(o, expect(seqs_of([4], 1000 * k), False))
    assert len(on_bad) < len(outs)
    for k, o in enumerate(later):
        assert not isinstance(o, Exception), o
        np.testing.assert_array_equal(o, expect(seqs_of([3, 3], 90_000 + 1000 * k), False))
    assert info[1]["failures"] >= len(on_bad) and "simulated device fault" in info[1]["last_error"]
    assert info[0]["failures"] == 0


def test_shutdown_answers_everything_queued_then_refuses():
    lanes = [Lane("a"), Lane("b")]
    for ln in lanes:
        ln.gate.clear()
    b = ReplicaBatcher(
        lanes, H, max_batch_tokens=8, max_batch_requests=2, max_queue_delay_us=50_000
    )

    async def main():
        jobs = [b.submit(seqs_of([3, 2, 4], 1000 * k), normalize=False) for k in range(8)]
        gone = b.submit(seqs_of([5], 777_000), normalize=False)
        gone.cancel()  # its client left: dropped before packing
        closer = threading.Thread(target=b.close)
        closer.start()
        for ln in lanes:
            ln.gate.set()
        outs = await gather_jobs(jobs)
        closer.join(30)
        assert not closer.is_alive()
        with pytest.raises(BatcherClosed):
            b.submit(seqs_of([1], 5), normalize=False)
        return outs

    outs = asyncio.run(main())
    for k, o in enumerate(outs):
        np.testing.assert_array_equal(o, expect(seqs_of([3, 2, 4], 1000 * k), False))
    assert all(not ln.thread.is_alive() for ln in b.lanes)
    assert all(777_000 not in c for ln in lanes for c in ln.calls)


# ---- --gpus / --replicas -------------------------------------------------------------------------
def test_plan_engines_validates_gpus_and_replicas():
    yes, no = (True, "2 CUDA device(s)"), (False, "cuda-bindings is not installed")

    def plan(gpu_count=2, cuda=yes, **kw):
        return plan_engines(ServeConfig(**kw), gpu_count=gpu_count, cuda_usable=cuda)

    assert plan(device="cpu") is None and plan(device="cuda") is None
    assert plan(device="cuda", gpus="all") == EnginePlan(("cuda:0", "cuda:1"))
    assert plan(device="cuda", gpus="1,0").devices == ("cuda:0", "cuda:1")
    assert plan(device="auto", gpus="1", gpu_count=4).devices == ("cuda:1",)
    assert plan(device="cpu", replicas=3) == EnginePlan(("cpu",) * 3, threads=1)
    assert plan(device="reference", replicas=2) == EnginePlan(("reference",) * 2)
    for kw, why in (
        (dict(device="cuda", gpus="0,1", cuda=no), "CUDA is not usable here .cuda-bindings"),
        (dict(device="cuda", gpus="all", gpu_count=0), "no CUDA GPU is visible"),
        (dict(device="cuda", gpus="0,2"), "GPU 2 does not exist here .2 visible; ids 0..1"),
        (dict(device="cuda", gpus="0,0"), "listed twice"),
        (dict(device="cuda", gpus="0,x"), "not an integer"),
        (dict(device="cpu", gpus="0"), "add --device cuda"),
        (dict(device="cuda", gpus="0", replicas=2), "leave one of them out"),
        (dict(device="cuda", replicas=2), "--replicas 2 is for CPU engines; on GPUs use --gpus"),
        (dict(device="cpu", replicas=0), "--replicas must be >= 1"),
    ):
        with pytest.raises(ValueError, match=why):
            plan(**kw)


def test_serve_cli_refuses_bad_gpus_before_anything_starts(capsys):
    from zoi.cli import main

    assert main(["serve", "--device", "cpu", "--gpus", "0,1", "--port", "0"]) == 2
    assert "add --device cuda" in capsys.readouterr().err
    assert main(["serve", "--device", "cuda", "--gpus", "0,0", "--port", "0"]) == 2
    assert "listed twice" in capsys.readouterr().err
    assert main(["serve", "--replicas", "0", "--port", "0"]) == 2
    assert "replicas must be >= 1" in capsys.readouterr().err


def test_device_strings():
    import zoi
    from zoi.backends import split_device
    from zoi.backends.cuda.options import CudaOptions
    from zoi.errors import BackendUnavailableError

    assert split_device("cuda:1") == ("cuda", 1) and split_device("cpu") == ("cpu", None)
    for bad, why in (
        ("cpu:0", "only 'cuda' takes"),
        ("cuda:a", "integer >= 0"),
        ("cuda:-1", ">= 0"),
    ):
        with pytest.raises(ValueError, match=why):
            split_device(bad)
    with pytest.raises(ValueError, match="only 'cuda' takes"):
        zoi.compile(device="cpu:1")
    assert CudaOptions.from_env({}, device_index=1).device_index == 1
    with pytest.raises(ValueError, match="device_index"):
        CudaOptions(device_index=-1)
    from zoi.backends import cuda_status

    if not cuda_status()[0]:  # no GPU here: the clear error, not a crash
        with pytest.raises(BackendUnavailableError, match="not usable here"):
            zoi.compile(device="cuda:0")


# ---- the real engines behind the HTTP server --------------------------------------------------------
httpx = pytest.importorskip("httpx")


class Broken:
    """An engine whose every call fails (a GPU gone bad), otherwise the real one."""

    def __init__(self, engine):
        self._e = engine

    def __getattr__(self, name):
        return getattr(self._e, name)

    def run_packed(self, *a, **k):
        raise RuntimeError("simulated device fault (engine gone bad)")


def _service(engines, **cfg):
    from zoi.serve.service import Service

    return Service(None, ServeConfig(**cfg), engines=engines)


def test_in_process_server_one_broken_engine_the_server_stays_up(engine):
    from zoi.serve.app import create_app
    from zoi.serve.replicas import replicate

    other = replicate(engine, engine.device, 1 if engine.device == "cpu" else None)
    svc = _service([other, Broken(other)], max_queue_delay_us=2000)
    app = create_app(svc)
    texts = mixed_texts(24, seed=3)

    async def main():
        tr = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=tr, base_url="http://t", timeout=120) as c:
            rs = await asyncio.gather(*[c.post("/embed", json={"inputs": [t]}) for t in texts])
            for _ in range(3):  # later requests: the healthy engine keeps answering
                rs.append(await c.post("/embed", json={"inputs": texts[:2]}))
            health = await c.get("/health")
            info = (await c.get("/info")).json()
            metrics = (await c.get("/metrics")).text
        return rs, health, info, metrics

    try:
        rs, health, info, metrics = asyncio.run(main())
    finally:
        svc.close()
    ok = [i for i, r in enumerate(rs[:24]) if r.status_code == 200]
    bad = [r for r in rs if r.status_code != 200]
    assert health.status_code == 200
    assert ok, "the healthy engine answered none"
    for r in bad:
        assert r.status_code == 500
        body = r.json()
        assert body["error_type"] == "Backend"
        assert "cpu:1 (engine 1 of 2)" in body["error"] or "engine 1 of 2" in body["error"]
        assert "simulated device fault" in body["error"]
    ref = engine.encode([texts[i] for i in ok])
    got = np.array([rs[i].json()[0] for i in ok])
    assert cosine_rows(got, ref).min() > 0.9999
    assert [e["device"] for e in info["engines"]] == [f"{engine.device}:0", f"{engine.device}:1"]
    assert info["device"] == f"{engine.device}:0,{engine.device}:1"
    assert info["engines"][0]["failures"] == 0
    if bad:
        assert info["engines"][1]["failures"] >= 1
        assert (
            metric(metrics, "zoi_engine_failures_total", f'device="{engine.device}:1",engine="1"')
            >= 1
        )


def test_zoi_serve_replicas_2_spreads_load_keeps_order_and_stops_cleanly(engine, device, tmp_path):
    """`zoi serve --device cpu --replicas 2`: the code path of `--gpus 0,1`, on two CPU engines."""
    from zoi.bench.loadtest import ServerProcess

    if device != "cpu":
        pytest.skip("CPU replicas need the native CPU engine")  # pragma: no cover
    srv = ServerProcess(
        args=["--device", "cpu", "--replicas", "2", "--max-queue-delay-us", "2000",
              "--log-level", "warning"],
        log_path=tmp_path / "serve.log",
    )  # fmt: skip
    texts = mixed_texts(160, seed=11)
    try:

        async def load():
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as c:
                sem = asyncio.Semaphore(24)

                async def one(i):
                    async with sem:
                        batch = texts[i : i + 4]
                        r = await c.post("/embed", json={"inputs": batch})
                        return i, r

                return await asyncio.gather(*[one(i) for i in range(0, len(texts), 4)])

        res = asyncio.run(load())
        info = httpx.get(srv.url + "/info").json()
        metrics = httpx.get(srv.url + "/metrics").text
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()[-3000:]
    assert all(r.status_code == 200 for _, r in res), [
        r.text for _, r in res if r.status_code != 200
    ]
    got = np.array([v for _, r in sorted(res, key=lambda x: x[0]) for v in r.json()])
    ref = engine.encode(texts)
    assert got.shape == ref.shape
    assert cosine_rows(got, ref).min() > 0.9999  # each request's rows, in its order
    assert info["device"] == "cpu:0,cpu:1" and len(info["engines"]) == 2
    assert all(e["batches"] > 0 for e in info["engines"]), json.dumps(info["engines"])
    assert sum(e["sequences"] for e in info["engines"]) >= len(texts)
    for i in (0, 1):
        assert metric(metrics, "zoi_engine_batches_total", f'device="cpu:{i}",engine="{i}"') > 0
    assert "stopped" in srv.log() and "none cut off" in srv.log()


def test_head_routes_spread_over_replicas_too(tmp_path):
    """A cross-encoder behind two CPU engines: /rerank goes through the heads' batcher, which
    is a ReplicaBatcher over the same engines; scores equal the engine's own."""
    from tests.heads.builders import head_checkpoint

    import zoi
    from zoi.serve.app import create_app
    from zoi.serve.replicas import ReplicaBatcher, replicate

    folder = head_checkpoint(tmp_path / "ce", "bert", "seq", 1, 0)[0]
    base = zoi.compile(folder, device="cpu")
    engines = [replicate(base, "cpu", 1), replicate(base, "cpu", 1)]
    svc = _service(engines, max_queue_delay_us=2000)
    assert isinstance(svc.heads.batcher, ReplicaBatcher)
    docs = [f"document number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(12)]

    async def main():
        tr = httpx.ASGITransport(app=create_app(svc))
        async with httpx.AsyncClient(transport=tr, base_url="http://t", timeout=120) as c:
            return await asyncio.gather(
                *[c.post("/rerank", json={"query": q, "texts": docs}) for q in ("cats", "dogs") * 4]
            )

    try:
        rs = asyncio.run(main())
        info = svc.heads.batcher.engines_info()
    finally:
        svc.close()
    for q, r in zip(("cats", "dogs") * 4, rs, strict=True):
        assert r.status_code == 200, r.text
        want = {w["corpus_id"]: w["score"] for w in base.rerank(q, docs)}
        got = {x["index"]: x["score"] for x in r.json()}
        assert got.keys() == want.keys()
        assert max(abs(got[k] - want[k]) for k in got) < 1e-4
    assert sum(e["sequences"] for e in info) >= 8 * len(docs)
