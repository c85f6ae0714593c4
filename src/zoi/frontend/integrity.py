"""Artifacts check themselves: digests of the weights, the spec and the tokenizer.

`Engine.save` records them in zoi.json (and the spec's and the weights' digests again in the
weights file's safetensors metadata); `zoi.load` recomputes them and refuses an artifact whose
zoi.json was edited (heads, layers, activation, arch, precision, quantisation) or whose
weights or tokenizer were swapped. Not a signature: it catches careless edits and mix-ups.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from zoi.errors import CheckpointError

KEYS = ("spec_sha256", "weights_sha256", "tokenizer_sha256")


def spec_digest(spec: dict, precision: str, quant: dict) -> str:
    """What the weights were compiled for: the spec, the precision, each linear's scheme and
    static scale (the quantiser's report fields are left out)."""
    q = {k: {"scheme": v.get("scheme"), "amax": v.get("amax")} for k, v in sorted(quant.items())}
    doc = {"spec": spec, "precision": precision, "quant": q}
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(raw.encode()).hexdigest()


def weights_digest(weights: dict[str, np.ndarray], done=None) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes; done(name) after each one
    (a mapped file releases its pages: zoi.frontend.safetensors_io.SafetensorsFile.release)."""
    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        if a.nbytes:
            h.update(memoryview(a.reshape(-1)).cast("B"))
        if done is not None:
            done(name)
    return h.hexdigest()


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record(spec: dict, precision: str, quant: dict, weights: dict, tokenizer_json: str) -> dict:
    return {
        "spec_sha256": spec_digest(spec, precision, quant),
        "weights_sha256": weights_digest(weights),
        "tokenizer_sha256": text_digest(tokenizer_json),
    }


def verify(
    folder, meta: dict, file_meta: dict, weights: dict, tokenizer_json: str, done=None
) -> bool:
    """Refuse (CheckpointError) an artifact whose parts do not match the digests it records.
    Returns False for an artifact saved before digests were recorded (nothing to check)."""
    rec = meta.get("integrity")
    if rec is None:
        return False
    if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in KEYS):
        raise CheckpointError(f"{folder}/zoi.json: malformed 'integrity' record")
    fix = "re-compile the model (zoi compile MODEL -o ART) instead of editing the artifact"
    spec_now = spec_digest(meta["spec"], meta["precision"], meta.get("quant", {}))
    if spec_now != rec["spec_sha256"] or spec_now != file_meta.get("zoi_spec_sha256", spec_now):
        raise CheckpointError(
            f"{folder}/zoi.json: the spec, precision or quantisation (heads, layers, "
            "activation, arch, ...) is not the one the weights were compiled with: zoi.json was "
            f"edited or belongs to another artifact; {fix}"
        )
    w_now = weights_digest(weights, done)
    if w_now != rec["weights_sha256"] or w_now != file_meta.get("zoi_weights_sha256", w_now):
        raise CheckpointError(
            f"{folder}/weights.safetensors: the weights are not the ones this artifact was "
            f"saved with (swapped or modified file); {fix}"
        )
    if text_digest(tokenizer_json) != rec["tokenizer_sha256"]:
        raise CheckpointError(
            f"{folder}/tokenizer.json: not the tokenizer this artifact was saved with "
            f"(swapped or modified file); {fix}"
        )
    return True
