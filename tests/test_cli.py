"""The zoi command line, run in-process."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import zoi
from zoi.cli import main


def test_info(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cores"] >= 1
    assert info["isa_best"] in ("amx", "vnni", "avx512", "avxvnni", "avx2", "scalar")
    assert "usable" in info["cuda"]
    assert main(["info"]) == 0
    assert "ISA" in capsys.readouterr().out


def test_compile_info_encode(small_bert, tmp_path, capsys, monkeypatch):
    art = tmp_path / "art"
    assert (
        main(
            [
                "compile",
                str(small_bert),
                "-o",
                str(art),
                "--device",
                "reference",
                "--max-tokens",
                "128",
            ]
        )
        == 0
    )
    assert (art / "zoi.json").exists()
    capsys.readouterr()
    assert main(["info", str(art)]) == 0
    out = capsys.readouterr().out
    assert "arena" in out and "MiB" in out
    assert main(["encode", "--model", str(art), "--device", "reference", "hello", "world"]) == 0
    res = json.loads(capsys.readouterr().out)
    ref = zoi.load(art, device="reference").encode(["hello", "world"])
    np.testing.assert_allclose(np.array(res["embeddings"]), ref, atol=1e-6)
    f = tmp_path / "t.txt"
    f.write_text("hello\n\nworld\n")
    assert (
        main(
            [
                "encode",
                "--model",
                str(art),
                "--device",
                "reference",
                "-f",
                str(f),
                "-o",
                str(tmp_path / "e.npy"),
            ]
        )
        == 0
    )
    # a blank line is a text too: row i is line i
    ref3 = zoi.load(art, device="reference").encode(["hello", "", "world"])
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), ref3, atol=1e-6)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nworld\n"))
    assert main(["encode", "--model", str(art), "--device", "reference", "-f", "-"]) == 0
    np.testing.assert_allclose(
        np.array(json.loads(capsys.readouterr().out)["embeddings"]), ref, atol=1e-6
    )


def test_errors_are_clean(tmp_path, capsys):
    assert main(["encode", "--model", str(tmp_path / "missing"), "--device", "reference", "x"]) == 2
    err = capsys.readouterr().err
    assert "zoi: error:" in err and "not a directory" in err
    with pytest.raises(SystemExit):
        main(["compile"])  # argparse: missing arguments
