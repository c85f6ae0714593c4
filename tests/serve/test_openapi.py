"""zoi.serve.openapi without a server: the shape every entry shares (the route tables write it
once), the KServe model routes and their versioned twins, the event stream of the generate
routes described per event."""

from __future__ import annotations

import pytest

from zoi.serve.http import STATUS
from zoi.serve.openapi import decoder_operations, operations

HEADS = ("", "seq_cls", "token_cls", "splade")


def _ops(doc: dict):
    for path, item in doc.items():
        for method, op in item.items():
            if method != "parameters":
                yield path, method, op


@pytest.mark.parametrize("head", HEADS)
def test_every_post_documents_its_body_example_and_errors(head):
    codes = {str(c) for c in STATUS.values()}
    posts = 0
    for path, method, op in _ops(operations("m", 8, 99, head)):
        assert op["summary"] and op["tags"] and op["responses"]["200"], path
        if method == "post":
            posts += 1
            body = op["requestBody"]["content"]["application/json"]
            assert op["requestBody"]["required"] and "example" in body, path
            assert body["schema"]["type"] == "object", path
            assert "schema" in op["responses"]["200"]["content"]["application/json"], path
            assert set(op["responses"]) - {"200"} == codes, path  # every status of STATUS
    assert posts >= 5


def test_kserve_model_routes_have_their_versioned_twin():
    ops = operations("m", 8)
    base = [p for p in ops if p.startswith("/v2/models/{model}") and "/versions/" not in p]
    assert sorted(base) == sorted(
        "/v2/models/{model}" + s for s in ("", "/ready", "/config", "/infer")
    )
    for p in base:
        v = p.replace("{model}", "{model}/versions/{version}", 1)
        (method, op), (vmethod, vop) = next(iter(ops[p].items())), next(iter(ops[v].items()))
        assert method == vmethod and op["tags"] == vop["tags"] == ["KServe v2"]
        assert [x["name"] for x in op["parameters"]] == ["model"], p
        assert [x["name"] for x in vop["parameters"]] == ["model", "version"], v
        assert set(op["responses"]) == set(vop["responses"]) and "404" in op["responses"], p
        assert ("requestBody" in op) == ("requestBody" in vop) == (p.endswith("/infer")), p


def test_decoder_routes():
    ops = decoder_operations("m")
    enc = operations("m", 8)
    for p in ("/metrics", "/docs", "/v1/models", "/openapi.json"):
        assert ops[p] == enc[p], p  # the same entry on both servers
    for p in ("/v1/completions", "/v1/chat/completions"):
        op = ops[p]["post"]
        ok = op["responses"]["200"]["content"]
        event = ok["text/event-stream"]["schema"]
        assert event["type"] == "object" and event["required"] == ["data"]  # one event
        choice = ok["application/json"]["schema"]["properties"]["choices"]["items"]
        key = "text" if p == "/v1/completions" else "message"
        assert choice["required"] == ["index", key, "finish_reason"]
        assert {"429", "503", "400"} <= set(op["responses"])
