"""What model.py runs inside a Triton instance, without Triton: decoding, batching, isolation."""

from __future__ import annotations

import numpy as np
import pytest

from zoi.integrations.triton_runtime import BatchRunner, RequestError, decode_texts

from .conftest import cosine_rows, mixed_texts


def test_decode_texts():
    arr = np.array([["héllo".encode()], [b"world"]], dtype=object)
    assert decode_texts(arr) == ["héllo", "world"]
    assert decode_texts(np.array([b"a", b"b"], dtype=object)) == ["a", "b"]
    with pytest.raises(RequestError, match=r"TEXT\[1\] is not valid UTF-8"):
        decode_texts(np.array([[b"ok"], [b"\xff\xfe"]], dtype=object))
    with pytest.raises(RequestError, match=r"TEXT\[0\] is an empty string"):
        decode_texts(np.array([[b""]], dtype=object))
    with pytest.raises(RequestError, match="TEXT is empty"):
        decode_texts(np.zeros((0, 1), dtype=object))


class Poisoned:
    """The real engine, failing any packed call that holds the token id `bad`."""

    def __init__(self, engine, bad: int):
        self._e, self.bad, self.calls = engine, bad, []

    def __getattr__(self, k):
        return getattr(self._e, k)

    def run_packed(self, ids, pos, cu, normalize=False):
        self.calls.append(len(cu) - 1)
        if np.any(ids == self.bad):
            raise RuntimeError("injected engine failure")
        return self._e.run_packed(ids, pos, cu, normalize)


def test_one_packed_call_per_batch_and_isolation(engine):
    texts = mixed_texts(30, seed=21)
    ref = engine.encode(texts)
    bad = int(engine.tokenize(["zebra"])[0][1])
    eng = Poisoned(engine, bad)
    r = BatchRunner(eng)
    reqs = [
        np.array([[t.encode()] for t in texts[i : i + 3]], dtype=object) for i in range(0, 30, 3)
    ]
    out = r.run(reqs)
    assert eng.calls == [30] and r.calls == 1  # every request of the batch in one call
    got = np.concatenate(out)
    assert cosine_rows(got, ref).min() >= 0.99999 and np.abs(got - ref).max() <= 1e-5
    # a request that breaks the engine: the batch is retried request by request
    eng.calls.clear()
    batch = [
        reqs[0],
        np.array([[b"a zebra"]], dtype=object),
        reqs[1],
        np.array([[b""]], dtype=object),
    ]
    out = r.run(batch)
    assert eng.calls == [7, 3, 1, 3]  # the packed call (3 + 1 + 3), then each alone
    assert isinstance(out[1], RuntimeError) and "injected" in str(out[1])
    assert isinstance(out[3], RequestError) and "empty string" in str(out[3])
    assert cosine_rows(out[0], ref[0:3]).min() >= 0.99999
    assert cosine_rows(out[2], ref[3:6]).min() >= 0.99999


def test_length_cap_and_truncation(engine):
    long = " ".join(["word"] * 400)
    r = BatchRunner(engine, max_input_chars=100)
    (e,) = r.run([["x" * 101]])
    assert isinstance(e, RequestError) and "over the cap of 100" in str(e)
    (emb,) = BatchRunner(engine).run([[long]])  # truncated to the model's 256 positions
    assert cosine_rows(emb, engine.encode([long])).min() >= 0.99999
    (e,) = BatchRunner(engine, truncate=False).run([[long]])
    assert isinstance(e, RequestError)
    raw = BatchRunner(engine, normalize=False).run([["a man eats"]])[0]
    assert abs(float(np.linalg.norm(raw)) - 1.0) > 1e-3  # not normalised when asked not to


def test_retry_rule_is_the_servers_and_needs_no_web_stack():
    """The Triton stub's Python may lack the serve extra: the shared retry rule
    (zoi.serve.isolate) comes without starlette, uvicorn or prometheus_client."""
    import subprocess
    import sys

    code = (
        "import sys, zoi.integrations.triton_runtime as t, zoi.serve.isolate as i\n"
        "assert t.run_isolated is i.run_isolated\n"
        "bad = sorted(m for m in ('starlette', 'uvicorn', 'prometheus_client', 'httpx') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
