"""What a fresh process that loads an INT8 artifact and encodes imports: neither HF `tokenizers`
(the native tokenizer covers the file) nor torch nor the libraries only compiling needs, and
the tokenizer option of zoi.load / ZOI_TOKENIZER still reaches HF tokenizers when asked (the
same check then sees it imported: the check can fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import zoi

# imported by compiling, calibrating or the HF fallback only: a process that loads an artifact
# the native tokenizer covers and encodes never needs them (numpy.random: +3 MB of libcrypto)
NOT_NEEDED = ("tokenizers", "torch", "transformers", "scipy", "sentencepiece", "numpy.random")

CHILD = r"""
import json, sys
import numpy as np
import zoi
choice = sys.argv[2] or None
e = zoi.load(sys.argv[1], device="cpu", tokenizer=choice)
v = e.encode(["a first text", "and a second one, a little longer"], normalize_embeddings=False)
names = json.loads(sys.argv[3])
print(json.dumps({
    "imported": [m for m in names if m in sys.modules],
    "kind": e.tokenizer.kind,
    "emb": np.asarray(v, dtype=np.float64).tolist(),
}))
"""


def _run(path, choice: str = "", zoi_tokenizer: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ZOI_TOKENIZER"}
    if zoi_tokenizer is not None:
        env["ZOI_TOKENIZER"] = zoi_tokenizer
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), choice, json.dumps(NOT_NEEDED)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def int8_artifact(small_bert, tmp_path_factory):
    eng = zoi.compile(
        small_bert, device="cpu", precision="int8", calibration="fast", max_tokens=256
    )
    path = tmp_path_factory.mktemp("lean") / "int8.zoi"
    eng.save(path)
    texts = ["a first text", "and a second one, a little longer"]
    return path, eng.encode(texts, normalize_embeddings=False)


def test_int8_load_and_encode_import_nothing_they_do_not_need(int8_artifact):
    path, want = int8_artifact
    got = _run(path)
    assert got["kind"] == "native WordPiece"
    assert got["imported"] == [], f"a lean process imported {got['imported']}"
    emb = np.asarray(got["emb"])
    assert np.isfinite(emb).all()
    np.testing.assert_array_equal(emb.astype(np.float32), want)


def test_the_check_sees_hf_tokenizers_when_it_is_asked_for(int8_artifact):
    """tokenizer="hf" (the argument, or ZOI_TOKENIZER=hf read by zoi.load): HF tokenizers
    runs, and the same check reports it imported, with the same embeddings."""
    path, want = int8_artifact
    for got in (_run(path, "hf"), _run(path, zoi_tokenizer="hf")):
        assert got["kind"] == "HF tokenizers (tokenizer='hf')"
        assert "tokenizers" in got["imported"]
        np.testing.assert_array_equal(np.asarray(got["emb"]).astype(np.float32), want)


def test_a_bad_tokenizer_option_names_the_option(int8_artifact, monkeypatch):
    path, _ = int8_artifact
    with pytest.raises(ValueError, match="tokenizer must be 'auto'.*got 'fastest'"):
        zoi.load(path, tokenizer="fastest")
    monkeypatch.setenv("ZOI_TOKENIZER", "fastest")
    with pytest.raises(ValueError, match="ZOI_TOKENIZER must be 'auto'.*got 'fastest'"):
        zoi.load(path)
    assert zoi.load(path, tokenizer="native").tokenizer.kind == "native WordPiece"  # arg wins


def _root(a):
    """What an array's memory belongs to, past every numpy view."""
    while isinstance(a, np.ndarray):
        a = a.base
    return a


def _mapped(addr: int) -> bool:
    with open("/proc/self/maps") as f:
        for ln in f:
            lo, hi = (int(x, 16) for x in ln.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the off-grid mapping is Linux's")
def test_the_word_table_is_mapped_off_the_huge_page_grid_with_the_same_bytes(int8_artifact):
    """A freshly written file's 2 MiB page-cache folios are mapped whole on a fault when the
    mapping's address is congruent to the file offset modulo 2 MiB: the table the engine reads
    a row per token is mapped one page off that grid (same bytes, read-only, unmapped with its
    last array)."""
    from zoi.frontend.safetensors_io import SafetensorsFile

    path, _ = int8_artifact
    f = SafetensorsFile(path / "weights.safetensors")
    name = "embed.word_q" if "embed.word_q" in f.names() else "embed.word"
    t = f.row_table(name)
    ref = f.get(name, float32=False)
    assert t is not None and not t.flags.writeable
    assert t.dtype == ref.dtype and t.shape == ref.shape and np.array_equal(t, ref)
    addr = t.__array_interface__["data"][0]
    _, _, begin, _ = f._info[name]
    assert (addr - (f._base + begin)) % (2 << 20) != 0
    assert type(_root(t)).__name__ == "_OffGridMap"
    assert type(_root(ref)).__name__ == "mmap"
    del t
    import gc

    gc.collect()
    assert not _mapped(addr)  # unmapped with its last array


def test_engines_with_and_without_the_off_grid_table_agree(int8_artifact, monkeypatch):
    from zoi.frontend.safetensors_io import SafetensorsFile

    path, want = int8_artifact
    texts = ["a first text", "and a second one, a little longer"]
    e = zoi.load(path, device="cpu")
    w = e.model.weights.get("embed.word_q", e.model.weights.get("embed.word"))
    assert type(_root(w)).__name__ == "_OffGridMap"
    monkeypatch.setattr(SafetensorsFile, "row_table", lambda self, n: None)
    e2 = zoi.load(path, device="cpu")
    w2 = e2.model.weights.get("embed.word_q", e2.model.weights.get("embed.word"))
    assert type(_root(w2)).__name__ == "mmap"
    got = [x.encode(texts, normalize_embeddings=False) for x in (e, e2)]
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], want)


def test_compile_takes_the_tokenizer_option(small_bert, monkeypatch):
    e = zoi.compile(small_bert, device="cpu", max_tokens=128, tokenizer="hf")
    assert e.tokenizer.kind == "HF tokenizers (tokenizer='hf')"
    monkeypatch.setenv("ZOI_TOKENIZER", "hf")
    assert zoi.compile(small_bert, device="cpu", max_tokens=128).tokenizer.native is None
    e = zoi.compile(small_bert, device="cpu", max_tokens=128, tokenizer="auto")  # the arg wins
    assert e.tokenizer.kind == "native WordPiece"
    with pytest.raises(ValueError, match="tokenizer must be 'auto'.*got 'wordpiece'"):
        zoi.compile(small_bert, device="cpu", tokenizer="wordpiece")
