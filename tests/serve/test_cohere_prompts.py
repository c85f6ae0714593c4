"""Cohere-style /v2/embed and the prompt a request names (OpenAI / TEI `prompt_name`,
Cohere `input_type`): each answer equal to engine.encode with that prompt; the number formats
derived from the float rows exactly as documented; bad values refused naming the field."""

from __future__ import annotations

import base64
import json
import shutil
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest

from zoi.bench.loadtest import ServerProcess
from zoi.serve.http import ApiError
from zoi.serve.service import Service

from .serve_helpers import serve_device

PROMPTS = {"query": "query: ", "document": "passage: "}
TEXTS = ["how do plants make food", "Photosynthesis turns light into chemical energy."]


def _post(url: str, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    import zoi
    from zoi.engine import default_model_path

    folder = tmp_path_factory.mktemp("m") / "prompted-minilm"
    shutil.copytree(default_model_path(), folder)
    cfg = folder / "config_sentence_transformers.json"
    meta = json.loads(cfg.read_text()) if cfg.exists() else {}
    meta.update(prompts=PROMPTS, default_prompt_name=None)
    cfg.write_text(json.dumps(meta))
    srv = ServerProcess(str(folder), env={"ZOI_DEVICE": serve_device(), "ZOI_LOG_LEVEL": "warning"})
    yield srv, zoi.compile(str(folder), device=serve_device())
    assert srv.stop() == 0, srv.log()[-3000:]


def test_input_type_and_prompt_name_pick_the_prompt(prompted):
    srv, eng = prompted
    q = eng.encode(TEXTS, prompt_name="query")
    d = eng.encode(TEXTS, prompt_name="document")
    bare = eng.encode(TEXTS)
    assert np.abs(q - bare).max() > 1e-3  # the prompt changes the vectors
    for itype, want in (("search_query", q), ("search_document", d), ("clustering", bare)):
        st, out = _post(srv.url + "/v2/embed", {"texts": TEXTS, "input_type": itype})
        assert st == 200, out
        got = np.array(out["embeddings"]["float"], np.float32)
        assert np.abs(got - want).max() <= 1e-5, itype
        assert out["texts"] == TEXTS and out["meta"]["billed_units"]["input_tokens"] > 0
    st, out = _post(srv.url + "/v1/embeddings", {"input": TEXTS, "prompt_name": "query"})
    assert st == 200
    assert np.abs(np.array([r["embedding"] for r in out["data"]]) - q).max() <= 1e-5
    st, out = _post(srv.url + "/embed", {"inputs": TEXTS, "prompt_name": "document"})
    assert st == 200 and np.abs(np.array(out) - d).max() <= 1e-5
    st, out = _post(srv.url + "/embed", {"inputs": TEXTS})
    assert st == 200 and np.abs(np.array(out) - bare).max() <= 1e-5


def test_formats_follow_the_float_rows(prompted):
    srv, eng = prompted
    body = {
        "texts": TEXTS,
        "input_type": "search_query",
        "embedding_types": ["float", "int8", "uint8", "binary", "ubinary", "base64"],
    }
    st, out = _post(srv.url + "/v2/embed", body)
    assert st == 200, out
    e = out["embeddings"]
    f = np.array(e["float"], np.float32)
    assert np.array_equal(np.array(e["int8"]), np.clip(np.rint(f * 127), -127, 127))
    assert np.array_equal(np.array(e["uint8"]), np.clip(np.rint((f + 1) * 127.5), 0, 255))
    bits = np.packbits(f > 0, axis=1)
    assert np.array_equal(np.array(e["ubinary"]), bits)
    assert np.array_equal(np.array(e["binary"]), bits.astype(int) - 128)
    assert np.array(e["binary"]).shape == (2, 384 // 8)
    b64 = np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in e["base64"]])
    assert np.array_equal(b64, f)
    st, out = _post(srv.url + "/v2/embed", {**body, "output_dimension": 64})
    g = np.array(out["embeddings"]["float"], np.float32)
    want = eng.encode(TEXTS, prompt_name="query")[:, :64]
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    assert g.shape == (2, 64) and np.abs(g - want).max() <= 1e-5


@pytest.mark.parametrize(
    "change, field",
    [
        ({"input_type": "image"}, "input_type"),
        ({"embedding_types": ["float", "fp4"]}, "embedding_types"),
        ({"output_dimension": 385}, "output_dimension"),
        ({"truncate": "START"}, "truncate"),
        ({"texts": []}, "texts"),
        ({"texts": "one string"}, "texts"),
        ({"model": "other"}, "model"),
    ],
)
def test_bad_values_are_refused_naming_the_field(prompted, change, field):
    srv, _ = prompted
    st, out = _post(srv.url + "/v2/embed", {"texts": TEXTS, **change})
    assert 400 <= st < 500 and field in out["message"], out


def test_unknown_prompt_name_lists_the_models_prompts(prompted):
    srv, _ = prompted
    st, out = _post(srv.url + "/v1/embeddings", {"input": TEXTS, "prompt_name": "nope"})
    assert st == 400 and "'document', 'query'" in out["error"]["message"]
    st, out = _post(srv.url + "/embed", {"inputs": TEXTS, "prompt_name": 3})
    assert st == 422 and "prompt_name" in out["error"]


def test_default_prompt_name_applies_when_none_is_named():
    eng = SimpleNamespace(
        model=SimpleNamespace(meta={"prompts": PROMPTS, "default_prompt_name": "query"})
    )
    svc = SimpleNamespace(engine=eng, prompts=lambda: Service.prompts(svc))
    assert Service.prompted(svc, ["a"], None) == ["query: a"]
    assert Service.prompted(svc, ["a"], "document") == ["passage: a"]
    eng.model.meta["default_prompt_name"] = None
    assert Service.prompted(svc, ["a"], None) == ["a"]
    with pytest.raises(ApiError, match="not one of this model's prompts"):
        Service.prompted(svc, ["a"], "other")
