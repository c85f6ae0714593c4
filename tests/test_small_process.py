"""A process that loads an artifact the native tokenizer runs: HF `tokenizers` is never imported,
the pages of the weights file read to verify and pack are released, and every answer is
unchanged (memory figures themselves live in `zoi bench`)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import zoi
from zoi.frontend.safetensors_io import SafetensorsFile


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("art") / "minilm.zoi"
    eng = zoi.compile()
    eng.save(path)
    return path, eng


def test_loading_a_wordpiece_artifact_never_imports_hf_tokenizers(artifact):
    path, eng = artifact
    code = (
        "import sys, numpy as np, zoi\n"
        f"e = zoi.load({str(path)!r})\n"
        "v = e.encode(['a first text', 'and a second one'])\n"
        "assert 'tokenizers' not in sys.modules, 'tokenizers imported'\n"
        "np.save(sys.stdout.buffer, v)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    import io

    got = np.load(io.BytesIO(r.stdout))
    np.testing.assert_array_equal(got, eng.encode(["a first text", "and a second one"]))


def test_hf_tokenizers_still_serves_what_only_it_gives(artifact):
    path, _ = artifact
    e = zoi.load(path)
    ids = e.tokenizer._hf_full.encode("hello world").ids  # built on first use
    assert ids[0] == 101 and ids[-1] == 102


def test_released_pages_read_back_the_same(artifact, tmp_path):
    path, _ = artifact
    f = SafetensorsFile(path / "weights.safetensors")
    names = f.names()
    before = {n: np.array(f.get(n, float32=False)) for n in names}
    for n in names[:3]:
        f.release(n)
    f.release()
    f.release()  # twice is harmless
    for n in names:
        np.testing.assert_array_equal(f.get(n, float32=False), before[n])


def test_a_compiled_folder_is_still_proved_by_hf_tokenizers(tmp_path):
    """Only an artifact (digest-checked when it was made) skips HF's proof of its file."""
    import json

    from zoi.engine import default_model_path
    from zoi.errors import CheckpointError
    from zoi.frontend.tokenizer import Tokenizer

    tj = (default_model_path() / "tokenizer.json").read_text()

    bad = json.loads(tj)
    bad["added_tokens"] = None  # the native tokenizer would run it; HF refuses it
    with pytest.raises(CheckpointError, match="not a valid tokenizers file"):
        Tokenizer(json.dumps(bad), 128)
    Tokenizer(json.dumps(bad), 128, validate=False)  # an artifact's: taken as proved
