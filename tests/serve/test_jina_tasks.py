"""Task adapters chosen per request on `zoi serve` (jina-embeddings-v3's LoRA, zoi.serve.tasks):
OpenAI / TEI `task`, Cohere `input_type` mapped onto the tasks; requests of several tasks ride in
one dynamic batch (one engine call) and each answer equals engine.encode with its task; unknown
tasks are refused listing the model's. A real `zoi serve` of a random jina-v3 checkpoint
(tests/archs/jina_helpers.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from tests.archs import jina_helpers as J

from zoi.bench.loadtest import ServerProcess
from zoi.serve.batcher import Batcher
from zoi.serve.metrics import Metrics
from zoi.serve.tasks import batch_tasks, tagged

from .serve_helpers import metric, serve_device

TEXTS = ["how do plants make food", "Photosynthesis turns light into chemical energy.", "x"]


def _post(url: str, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, engine) of one jina-v3 folder with adapters; the server waits up to 0.2 s for a
    batch to fill, so requests sent together share an engine call."""
    import zoi

    _, folder, _, _ = J.checkpoint(tmp_path_factory.mktemp("jina") / "jina-v3", seed=5)
    srv = ServerProcess(
        str(folder),
        env={"ZOI_DEVICE": serve_device(), "ZOI_LOG_LEVEL": "warning"},
        args=["--max-queue-delay-us", "200000"],
    )
    yield srv, zoi.compile(str(folder), device=serve_device())
    assert srv.stop() == 0, srv.log()[-3000:]


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=2e-6, rtol=0)


def test_openai_and_tei_task(served):
    srv, eng = served
    for task in J.TASKS:
        want = eng.encode(TEXTS, task=task)
        st, out = _post(srv.url + "/v1/embeddings", {"input": TEXTS, "task": task})
        assert st == 200, out
        _close([d["embedding"] for d in out["data"]], want)
        st, out = _post(srv.url + "/embed", {"inputs": TEXTS, "task": task})
        assert st == 200, out
        _close(out, want)
    # no task: the base weights; a named prompt replaces the task's instruction
    st, out = _post(srv.url + "/v1/embeddings", {"input": TEXTS})
    _close([d["embedding"] for d in out["data"]], eng.encode(TEXTS))
    body = {"input": TEXTS, "task": "retrieval.passage", "prompt_name": "retrieval.query"}
    st, out = _post(srv.url + "/v1/embeddings", body)
    want = eng.encode(TEXTS, task="retrieval.passage", prompt_name="retrieval.query")
    _close([d["embedding"] for d in out["data"]], want)
    # token ids: the adapter, no instruction
    ids = [s.tolist() for s in eng.tokenize(TEXTS)]
    st, out = _post(srv.url + "/embed", {"inputs": ids, "task": "separation"})
    assert st == 200, out
    _close(out, eng.encode(TEXTS, task="separation", prompt=""))


def test_cohere_input_type_picks_the_adapter(served):
    srv, eng = served
    for itype, task in (
        ("search_query", "retrieval.query"),
        ("search_document", "retrieval.passage"),
        ("classification", "classification"),
        ("clustering", "separation"),
    ):
        st, out = _post(srv.url + "/v2/embed", {"texts": TEXTS, "input_type": itype})
        assert st == 200, out
        _close(out["embeddings"]["float"], eng.encode(TEXTS, task=task))


def test_unknown_task_is_refused(served):
    srv, _ = served
    st, out = _post(srv.url + "/v1/embeddings", {"input": TEXTS, "task": "retrieval"})
    assert st == 400 and out["error"]["param"] == "task"
    assert "retrieval.query, retrieval.passage, separation" in out["error"]["message"]
    st, out = _post(srv.url + "/embed", {"inputs": TEXTS, "task": 3})
    assert st in (400, 422) and "task" in out["error"]


def test_one_dynamic_batch_holds_several_tasks(served):
    """Requests of every task sent together: fewer engine calls than requests (they shared a
    batch), and each answer is its own task's."""
    srv, eng = served
    before = metric(_get(srv.url + "/metrics"), "zoi_batch_size_count")
    tasks = [*J.TASKS, None]
    answers: dict = {}
    go = threading.Barrier(len(tasks))

    def send(task):
        body = {"input": TEXTS} | ({"task": task} if task else {})
        go.wait()
        answers[task] = _post(srv.url + "/v1/embeddings", body)

    threads = [threading.Thread(target=send, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    calls = metric(_get(srv.url + "/metrics"), "zoi_batch_size_count") - before
    assert 1 <= calls < len(tasks)
    for task, (st, out) in answers.items():
        assert st == 200, out
        want = eng.encode(TEXTS, task=task) if task else eng.encode(TEXTS)
        _close([d["embedding"] for d in out["data"]], want)


def test_the_batcher_carries_each_sequences_task():
    """The tagged sequences of jobs of different tasks reach one engine call with their ids."""
    calls = []

    def run(seqs):
        calls.append(batch_tasks(seqs))
        return np.stack([np.full(2, getattr(s, "task", -1), np.float32) for s in seqs])

    b = Batcher(run, 2, max_batch_tokens=100, max_batch_requests=10, metrics=Metrics())
    b._cond.acquire()  # hold the worker: every job queues before the first batch is taken

    async def main():
        seqs = [np.arange(3, dtype=np.int32), np.arange(4, dtype=np.int32)]
        jobs = [b.submit(tagged(seqs, t), normalize=False) for t in (2, None, 0)]
        b._cond.release()
        return [await j.future for j in jobs]

    outs = asyncio.run(main())
    b.close()
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0]["tasks"], [2, 2, -1, -1, 0, 0])
    for out, t in zip(outs, (2, -1, 0), strict=True):
        np.testing.assert_array_equal(out, np.full((2, 2), t, np.float32))
    assert batch_tasks([np.arange(3)]) == {}  # untagged: the engine is called as always
