"""Hostile inputs to the command line and the compiler: `zoi encode -f` on files of any size,
the pooling of a folder without a sentence-transformers config, config and option values out
of range, and the temporaries of a killed save."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import zoi
from zoi import cli
from zoi.cli import main
from zoi.errors import CheckpointError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def art(small_bert, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("art") / "art"
    zoi.compile(small_bert, device="reference", max_tokens=64).save(out)
    return out


@pytest.fixture(scope="module")
def ref_engine(art):
    return zoi.load(art, device="reference")


def _encode(art: Path, *extra: str) -> int:
    return main(["encode", "--model", str(art), "--device", "reference", *extra])


# ---- `zoi encode -f`: chunks, streamed output, a cap per line --------------------------------
LINES = ["first line", "", "third line", "   ", "fifth", "a somewhat longer sixth line here"]


def test_encode_file_in_chunks_equals_one_call(art, ref_engine, tmp_path, monkeypatch, capsys):
    """Chunks of 4 texts, every output format: the rows equal one encode() of all lines,
    blank lines and CRLF endings included, and the files are what np / json / csv read."""
    monkeypatch.setattr(cli, "CHUNK_TEXTS", 4)
    texts = [f"{t} {i}" if i % 3 else t for i, t in enumerate(LINES * 3)]
    f = tmp_path / "texts.txt"
    f.write_bytes(("\n".join(texts[:5]) + "\r\n" + "\n".join(texts[5:]) + "\n").encode())
    calls = []
    real = zoi.Engine.encode

    def spy(self, sentences, *a, **k):
        calls.append(len(sentences))
        return real(self, sentences, *a, **k)

    monkeypatch.setattr(zoi.Engine, "encode", spy)
    want = real(ref_engine, texts)
    for ext in (".npy", ".json", ".csv"):
        calls.clear()
        out = tmp_path / f"emb{ext}"
        assert _encode(art, "-f", str(f), "-o", str(out)) == 0
        assert max(calls) <= 4 and sum(calls) == len(texts)
        if ext == ".npy":
            got = np.load(out)
            assert got.dtype == np.float32 and got.shape == want.shape
        elif ext == ".json":
            doc = json.loads(out.read_text())
            assert doc["dim"] == want.shape[1] and doc["model"] == ref_engine.spec.name
            got = np.array(doc["embeddings"])
        else:
            got = np.loadtxt(out, delimiter=",")
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert not list(tmp_path.glob(".emb*"))  # no partial file left beside it
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", open(f, "rb"))  # noqa: SIM115 - a real binary stdin
    try:
        assert _encode(art, "-f", "-") == 0
    finally:
        sys.stdin.close()
    doc = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(np.array(doc["embeddings"]), want, atol=1e-6)


def test_encode_empty_file_gives_no_rows(art, ref_engine, tmp_path, capsys):
    f = tmp_path / "empty.txt"
    f.write_text("")
    assert _encode(art, "-f", str(f)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["embeddings"] == [] and doc["dim"] == ref_engine.spec.hidden
    out = tmp_path / "e.npy"
    assert _encode(art, "-f", str(f), "-o", str(out)) == 0
    assert np.load(out).shape == (0, ref_engine.spec.hidden)


def test_encode_refuses_a_line_over_the_cap_naming_it(art, tmp_path, capsys):
    """A 50 MB line (no newline at all) is refused at once, naming its line and the limit;
    no output file is left."""
    f = tmp_path / "big.txt"
    with open(f, "wb") as fh:
        fh.write(b"one\ntwo\n")
        block = b"x" * (1 << 20)
        for _ in range(50):
            fh.write(block)
    out = tmp_path / "e.npy"
    t0 = time.perf_counter()
    assert _encode(art, "-f", str(f), "-o", str(out)) == 2
    assert time.perf_counter() - t0 < 30
    err = capsys.readouterr().err
    assert "line 3 is longer than the limit of 1048576 bytes" in err
    assert "--max-line-bytes" in err and str(f) in err
    assert not out.exists() and not list(tmp_path.glob(".e.npy*"))
    # a raised limit reads it; a line within the cap is fine
    small = tmp_path / "ok.txt"
    small.write_bytes(b"y" * 5000 + b"\n")
    assert _encode(art, "-f", str(small), "--max-line-bytes", "4999") == 2
    assert "line 1 is longer than the limit of 4999 bytes" in capsys.readouterr().err
    assert _encode(art, "-f", str(small), "--max-line-bytes", "5000") == 0


def test_encode_memory_stays_bounded_on_a_huge_line(art, tmp_path):
    """The peak memory of `zoi encode -f` on a 50 MB one-line file is that of a small file:
    the line is never held (a process of its own, its maximum resident set measured)."""
    big = tmp_path / "one_line.txt"
    with open(big, "wb") as fh:
        for _ in range(50):
            fh.write(b"word " * (1 << 18))  # 1.25 MiB each, no newline anywhere
    small = tmp_path / "small.txt"
    small.write_text("hello\nworld\n")
    code = textwrap.dedent(
        """
        import resource, sys
        from zoi.cli import main
        rc = main(["encode", "--model", sys.argv[1], "--device", "reference", "-f", sys.argv[2],
                   "-o", sys.argv[3]])
        print("RSS", rc, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        """
    )

    def peak(path: Path) -> tuple[int, int]:
        r = subprocess.run(
            [sys.executable, "-c", code, str(art), str(path), str(tmp_path / "o.npy")],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        line = [x for x in r.stdout.splitlines() if x.startswith("RSS")]
        assert line, r.stdout + r.stderr
        _, rc, kib = line[0].split()
        return int(rc), int(kib)

    rc_small, base = peak(small)
    rc_big, got = peak(big)
    assert rc_small == 0 and rc_big == 2
    assert got - base < 20 * 1024, f"peak RSS {got} KiB against {base} KiB for a small file"


def test_encode_endless_stream_without_newline_stops(art):
    """A stream that never ends a line (what `-f /dev/zero` reads) stops at the cap with the
    error, instead of reading until memory runs out."""
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys\nwhile True: sys.stdout.buffer.write(bytes(65536))"],
        stdout=subprocess.PIPE,
    )
    try:
        r = subprocess.run(
            [sys.executable, "-m", "zoi.cli", "encode", "-m", str(art), "--device", "reference"]
            + ["-f", "-"],
            stdin=writer.stdout,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    finally:
        writer.stdout.close()
        writer.kill()
        writer.wait()
    assert r.returncode == 2, r.stderr
    assert "stdin: line 1 is longer than the limit of 1048576 bytes" in r.stderr


def test_encode_errors_name_the_line(art, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "CHUNK_TEXTS", 2)
    f = tmp_path / "t.txt"
    f.write_text("a\nb\nc\nd\n" + "word " * 200 + "\nf\n", encoding="utf-8")
    assert _encode(art, "-f", str(f), "--no-truncate") == 2
    err = capsys.readouterr().err
    assert f"line 5 of {f}" in err and "leave out --no-truncate" in err
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\n\xff\xfe broken\n")
    assert _encode(art, "-f", str(bad)) == 2
    assert "line 3 is not valid UTF-8" in capsys.readouterr().err


# ---- pooling without a sentence-transformers config ------------------------------------------
def _st_embed(folder: Path, texts: list[str]) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers")
    m = st.SentenceTransformer(str(folder), device="cpu")
    return np.asarray(m.encode(texts, convert_to_numpy=True, normalize_embeddings=False))


def _cos_rows(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "x", "tokens " * 30]


@pytest.mark.parametrize("arch", ["modernbert", "bert", "electra"])
def test_plain_folder_pools_as_sentence_transformers(arch, tmp_path, caplog):
    """A folder saved by transformers' save_pretrained alone (no modules.json): zoi's embedding
    is sentence-transformers' one of the same folder (mean pooling; ModernBERT's
    classifier_pooling 'cls' is its classification head's, and a warning says so)."""
    folder = tmp_path / arch
    if arch == "bert":
        from tests.conftest import build_hf_model, save_checkpoint

        save_checkpoint(build_hf_model("bert"), folder)
    else:
        from tests.archs.helpers import checkpoint

        checkpoint(arch, folder, seed=7, pooling=None)
    assert not (folder / "modules.json").exists()
    with caplog.at_level(logging.INFO, logger="zoi"):
        eng = zoi.compile(folder, device="reference", max_tokens=512)
    assert eng.spec.pooling == "mean"
    assert "no sentence-transformers config" in eng.model.meta["pooling"]["origin"]
    said = [r for r in caplog.records if "pooling: mean" in r.getMessage()]
    assert said, "the compile says which pooling it chose"
    if arch == "modernbert":
        assert said[0].levelno == logging.WARNING and "classifier_pooling" in said[0].getMessage()
    got = eng.encode(TEXTS, normalize_embeddings=False)
    want = _st_embed(folder, TEXTS)
    assert _cos_rows(got, want).min() >= 0.99999


def test_pooling_option_overrides_and_is_shown(tmp_path, capsys):
    from tests.archs.helpers import checkpoint, hf_hidden

    model, folder = checkpoint("modernbert", tmp_path / "mb", seed=7, pooling=None)
    eng = zoi.compile(folder, device="reference", max_tokens=512, pooling="cls")
    assert eng.spec.pooling == "cls"
    got = eng.encode(TEXTS[:3], normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s)[0] for s in eng.tokenize(TEXTS[:3])])
    assert _cos_rows(got, want).min() >= 0.99999
    with pytest.raises(ValueError, match="pooling='avg' is not supported"):
        zoi.compile(folder, device="reference", pooling="avg")
    # the command line: --pooling at compile, the choice and its origin in `zoi info`
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "no sentence-transformers config" in out and "--pooling" in out
    art = tmp_path / "art"
    argv = ["compile", str(folder), "-o", str(art), "--device", "reference", "--max-tokens", "512"]
    assert main([*argv, "--pooling", "cls"]) == 0
    err_out = capsys.readouterr()
    assert "pooling: cls (pooling='cls' given" in err_out.out + err_out.err
    assert zoi.load(art, device="reference").spec.pooling == "cls"
    assert main(["info", str(art)]) == 0
    assert "pooling='cls' given" in capsys.readouterr().out
    assert _encode(art, "--pooling", "mean", "hi") == 2
    assert "compiled with pooling 'cls'" in capsys.readouterr().err
    assert main([*argv]) == 0  # no option: sentence-transformers' default, printed
    printed = capsys.readouterr()
    assert "pooling: mean (no sentence-transformers config" in printed.out + printed.err


def test_default_pooling_follows_sentence_transformers():
    from zoi.frontend.checkpoint import default_pooling

    assert default_pooling({"architectures": ["ModernBertForMaskedLM"]}) == "mean"
    assert default_pooling({"architectures": ["BertModel"], "classifier_pooling": "cls"}) == "mean"
    assert default_pooling({}) == "mean"
    assert default_pooling({"architectures": ["Qwen3ForCausalLM"]}) == "last"
    assert default_pooling({"architectures": ["Qwen3ForCausalLM"], "is_causal": False}) == "mean"
    assert default_pooling({"architectures": ["Qwen3Model"]}) == "mean"


# ---- values out of range: named, before anything is allocated ---------------------------------
@pytest.fixture()
def ckpt(small_bert, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(small_bert, dst)
    return dst


def _edit(path: Path, **kw):
    d = json.loads(path.read_text())
    d.update(kw)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize(
    "field,value,expect",
    [
        ("num_hidden_layers", 0, "num_hidden_layers is 0; it must be an integer in [1, 1024]"),
        ("num_attention_heads", 0, "num_attention_heads is 0; it must be an integer in [1, 1024]"),
        ("hidden_size", 0, "hidden_size is 0; it must be an integer in [1, 65536]"),
        ("intermediate_size", 0, "intermediate_size is 0; it must be an integer in [1, 262144]"),
        ("vocab_size", 0, "vocab_size is 0; it must be an integer in [1, 16777216]"),
        ("max_position_embeddings", 1, "max_position_embeddings is 1; it must be an integer in"),
        ("num_attention_heads", 7, "hidden_size 60 is not a multiple of num_attention_heads 7"),
        ("num_hidden_layers", 5000, "num_hidden_layers 5000 is implausibly large (limit 1024)"),
    ],
)
def test_config_sizes_are_named(ckpt, field, value, expect):
    _edit(ckpt / "config.json", **{field: value})
    with pytest.raises(CheckpointError) as e:
        zoi.compile(ckpt, device="reference")
    assert expect in str(e.value) and "config.json" in str(e.value)


def test_config_sizes_of_other_archs_are_named(tmp_path):
    from tests.archs.helpers import checkpoint

    _, folder = checkpoint("modernbert", tmp_path / "mb", seed=1)
    _edit(folder / "config.json", num_hidden_layers=0)
    with pytest.raises(CheckpointError, match=r"num_hidden_layers is 0; it must be an integer"):
        zoi.compile(folder, device="reference")
    from tests.conftest import build_hf_model, save_checkpoint

    d = save_checkpoint(build_hf_model("distilbert"), tmp_path / "db")
    _edit(d / "config.json", n_layers=0)
    with pytest.raises(
        CheckpointError, match=r"n_layers is 0; it must be an integer in \[1, 1024\]"
    ):
        zoi.compile(d, device="reference")


def test_st_max_seq_length_out_of_range_is_named(ckpt):
    (ckpt / "sentence_bert_config.json").write_text('{"max_seq_length": 0}')
    with pytest.raises(
        CheckpointError, match=r"max_seq_length is 0; it must be an integer in \[2, "
    ):
        zoi.compile(ckpt, device="reference")
    (ckpt / "sentence_bert_config.json").write_text('{"max_seq_length": null}')
    assert zoi.compile(ckpt, device="reference").spec.max_positions == 64
    (ckpt / "sentence_bert_config.json").write_text('{"max_seq_length": 32}')
    assert zoi.compile(ckpt, device="reference").spec.max_positions == 32


@pytest.mark.parametrize(
    "kw,expect",
    [
        (
            {"max_batch": 10**6},
            r"max_batch=1000000 is out of range: it must lie in \[1, max_tokens=4096\]",
        ),
        ({"max_batch": 0}, r"max_batch=0 is out of range: it must lie in \[1, max_tokens=4096\]"),
        ({"max_tokens": 0}, r"max_tokens=0 is out of range: it must lie in \[1, "),
        ({"max_tokens": 128, "max_batch": 129}, r"max_batch=129 .* \[1, max_tokens=128\]"),
    ],
)
def test_compile_options_checked_before_loading(small_bert, monkeypatch, kw, expect):
    import zoi.engine

    def never(*a, **k):
        raise AssertionError("the checkpoint was loaded before the options were checked")

    monkeypatch.setattr(zoi.engine, "load_checkpoint", never)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=expect):
        zoi.compile(small_bert, device="reference", **kw)
    assert time.perf_counter() - t0 < 0.5


# ---- temporaries of a killed save ---------------------------------------------------------------
@pytest.fixture(scope="module")
def small_engine(small_bert):
    return zoi.compile(small_bert, device="reference", max_tokens=64)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_killed_save_leaves_a_temp_that_the_next_save_removes(small_engine, tmp_path):
    """A compile SIGKILLed while it writes the artifact (its temporary folder and lock made,
    a file half written) leaves them; the next save of that artifact removes both."""
    dest = tmp_path / "ART"
    child = textwrap.dedent(
        """
        import os, signal, sys
        from pathlib import Path
        from zoi.engine import _claim_temp
        tmp, fd = _claim_temp(Path(sys.argv[1]))
        (tmp / "weights.safetensors").write_bytes(b"\\0" * (1 << 20))
        print(tmp, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", child, str(dest)], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == -signal.SIGKILL, r.stderr
    stale = Path(r.stdout.strip())
    assert stale.is_dir() and Path(str(stale) + ".lock").exists()
    assert stale.name.startswith(".ART.tmp-")
    small_engine.save(dest)
    assert (dest / "zoi.json").exists()
    assert not stale.exists() and not Path(str(stale) + ".lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ART"]


def test_stale_temp_of_a_dead_pid_removed_live_ones_kept(small_engine, tmp_path, caplog):
    dead = _dead_pid()
    stale = tmp_path / f".ART.tmp-{dead}-0123abcd"
    stale.mkdir()
    (stale / "weights.safetensors").write_bytes(b"\0" * 4096)
    orphan_lock = tmp_path / f".ART.tmp-{dead}-89abcdef.lock"
    orphan_lock.write_text("")
    live = tmp_path / f".ART.tmp-{os.getpid()}-00000000"  # this process: alive
    live.mkdir()
    other = tmp_path / f".OTHER.tmp-{dead}-0123abcd"  # another artifact's: not ours to judge
    other.mkdir()
    legacy = tmp_path / ".ART.tmp-a1b2c3d4"  # an older zoi's name: no pid, never removed
    legacy.mkdir()
    # a dead pid in the name, but a live process holds the lock (a writer in another pid
    # namespace): kept
    held = tmp_path / f".ART.tmp-{dead}-fedcba98"
    held.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)",
            str(held) + ".lock",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.WARNING, logger="zoi"):
            small_engine.save(tmp_path / "ART")
    finally:
        holder.kill()
        holder.wait()
    assert not stale.exists() and not orphan_lock.exists()
    assert live.exists() and other.exists() and legacy.exists() and held.exists()
    assert any(
        "older zoi" in r.getMessage() and "a1b2c3d4" in r.getMessage() for r in caplog.records
    )
    # the holder is gone now: the next save takes its folder too
    small_engine.save(tmp_path / "ART")
    assert not held.exists() and live.exists()


def test_save_over_an_old_artifact_left_by_a_killed_save(small_engine, tmp_path):
    """Killed between its two renames, a save leaves the previous artifact as .ART.old-PID;
    the next save, once its new artifact is in place, removes it."""
    dead = _dead_pid()
    old = tmp_path / f".ART.old-{dead}"
    small_engine.save(old)
    small_engine.save(tmp_path / "ART")
    assert not old.exists() and (tmp_path / "ART" / "zoi.json").exists()
