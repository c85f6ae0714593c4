"""`zoi convert`: pickled heads refused at compile, converted once in a child process (torch's
weights_only loader), never unpickled in zoi's own process."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tests.heads.mv_builders import bge_m3_folder, pylate_folder

import zoi
from zoi.cli import main
from zoi.errors import CheckpointError, ZoiError
from zoi.frontend.convert import convert_folder

TEXTS = ["hello world", "the quick brown fox", "naïve café"]


@pytest.fixture(scope="module")
def pickled(tmp_path_factory):
    """(folder with sparse_linear.pt / colbert_linear.pt, the same heads as safetensors)."""
    root = tmp_path_factory.mktemp("convert")
    a = bge_m3_folder(root / "pt", seed=4, pickles=True, colbert_dim=17)[0]
    b = bge_m3_folder(root / "st", seed=4, pickles=False, colbert_dim=17)[0]
    return a, b


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_compile_refuses_pickles(pickled, tmp_path):
    folder = _copy(pickled[0], tmp_path / "m3")
    with pytest.raises(CheckpointError) as e:
        zoi.compile(folder, device="reference")
    msg = str(e.value)
    assert "sparse_linear.pt" in msg and f"zoi convert {folder}" in msg and "never loads" in msg
    (folder / "sparse_linear.pt").unlink()  # the other head is named too
    with pytest.raises(CheckpointError, match="colbert_linear.pt"):
        zoi.compile(folder, device="reference")


def test_convert_then_compile(pickled, tmp_path, monkeypatch, capsys):
    folder = _copy(pickled[0], tmp_path / "m3")
    # zoi's own process never unpickles: every unpickling entry point fails here
    import torch

    def refuse(*a, **k):
        raise AssertionError("unpickled in zoi's process")

    for mod, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(mod, name, refuse)
    runs = []
    real_run = subprocess.run

    def spy(cmd, *a, **k):
        runs.append(cmd)
        return real_run(cmd, *a, **k)

    monkeypatch.setattr(subprocess, "run", spy)
    assert main(["convert", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "written:" in out and "sparse_linear.safetensors" in out and "[17, 36]" in out
    assert len(runs) == 1 and runs[0][0] == sys.executable and runs[0][1] == "-c"
    for stem in ("sparse_linear", "colbert_linear"):
        assert (folder / f"{stem}.safetensors").is_file()
        assert not list(folder.glob(f".{stem}.safetensors.tmp-*"))
    assert main(["convert", str(folder)]) == 0  # a second run writes nothing
    assert capsys.readouterr().out.count("up to date:") == 2
    monkeypatch.undo()
    # then compile reads the safetensors heads: as a folder built with them
    a = zoi.compile(folder, device="cpu").encode_multi(TEXTS)
    b = zoi.compile(pickled[1], device="cpu").encode_multi(TEXTS)
    np.testing.assert_array_equal(a["dense"], b["dense"])
    for x, y in zip(a["colbert"], b["colbert"], strict=True):
        np.testing.assert_array_equal(x, y)
    for (i, v), (j, w) in zip(a["sparse"], b["sparse"], strict=True):
        np.testing.assert_array_equal(i, j)
        np.testing.assert_array_equal(v, w)


def test_existing_files_kept(pickled, tmp_path):
    folder = _copy(pickled[0], tmp_path / "m3")
    shutil.copy(pickled[1] / "colbert_linear.safetensors", folder / "colbert_linear.safetensors")
    # a different head of the same shapes: refused, nothing written, unless forced
    import torch

    sd = torch.load(folder / "sparse_linear.pt", weights_only=True)  # the test's own file
    sd["bias"] = sd["bias"] + 1
    from safetensors.torch import save_file

    save_file(sd, folder / "sparse_linear.safetensors")
    before = (folder / "sparse_linear.safetensors").read_bytes()
    with pytest.raises(ZoiError, match="differs from sparse_linear.pt .*bias.*--force"):
        convert_folder(folder)
    assert (folder / "sparse_linear.safetensors").read_bytes() == before
    done = {c.dst.name: c.status for c in convert_folder(folder, force=True)}
    assert done == {
        "sparse_linear.safetensors": "replaced",
        "colbert_linear.safetensors": "up to date",
    }
    assert (folder / "sparse_linear.safetensors").read_bytes() != before


def test_shapes_checked(tmp_path):
    import torch

    folder, _, _ = bge_m3_folder(tmp_path / "m3", seed=5, heads=("sparse",), pickles=True)
    torch.save({"weight": torch.zeros(2, 36), "bias": torch.zeros(2)}, folder / "sparse_linear.pt")
    with pytest.raises(CheckpointError, match=r"weight has shape \[2, 36\], expected \[1, 36\]"):
        convert_folder(folder)
    torch.save({"linear.weight": torch.zeros(1, 36)}, folder / "sparse_linear.pt")
    with pytest.raises(CheckpointError, match="holds tensors"):
        convert_folder(folder)
    assert not (folder / "sparse_linear.safetensors").exists()


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch '{self.path}'",))


def test_malicious_pickle_refused(tmp_path):
    folder, _, _ = bge_m3_folder(tmp_path / "m3", seed=6, heads=("sparse",), pickles=True)
    marker = tmp_path / "PWNED"
    with open(folder / "sparse_linear.pt", "wb") as fh:
        # what unpickling without weights_only would run
        pickle.dump({"weight": _Evil(marker)}, fh)
    with pytest.raises(CheckpointError, match="weights_only loader refused it"):
        convert_folder(folder)
    assert not marker.exists() and not (folder / "sparse_linear.safetensors").exists()


def test_torch_missing(pickled, tmp_path):
    """An interpreter without torch (here: site-packages off): said plainly, nothing written."""
    folder = _copy(pickled[0], tmp_path / "m3")
    py = tmp_path / "python-without-torch"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    py.chmod(0o755)
    with pytest.raises(ZoiError, match="cannot import .*install it .*--python"):
        convert_folder(folder, python=str(py))
    assert main(["convert", str(folder), "--python", str(py)]) == 2
    assert not (folder / "sparse_linear.safetensors").exists()


def test_dense_module_pickle(tmp_path, capsys):
    """A sentence-transformers Dense module kept as pytorch_model.bin (a ColBERT projection):
    refused at compile naming `zoi convert`, converted to its model.safetensors."""
    import torch

    folder, _, lin, _ = pylate_folder(tmp_path / "colbert", seed=2)
    good = zoi.compile(folder, device="cpu").encode_multi(TEXTS, "colbert")
    d = folder / "1_Dense"
    (d / "model.safetensors").unlink()
    torch.save({"linear.weight": lin.weight.detach().clone()}, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="zoi convert"):
        zoi.compile(folder, device="cpu")
    assert main(["convert", str(folder)]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    for x, y in zip(
        zoi.compile(folder, device="cpu").encode_multi(TEXTS, "colbert"), good, strict=True
    ):
        np.testing.assert_array_equal(x, y)


def test_nothing_to_convert(pickled, capsys):
    assert main(["convert", str(pickled[1])]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert main(["convert", str(pickled[1] / "missing")]) == 2
