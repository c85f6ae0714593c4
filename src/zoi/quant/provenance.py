"""What an INT8 artifact was made from: digests of its inputs, recorded in zoi.json.

Two compiles with equal `inputs` give the same weights.safetensors bytes (the quantiser's
arithmetic is order-independent: zoi.quant.detmath), on any machine, numpy version or
thread count. The digests are SHA-256, hex:

- weights: the canonical float32 weights zoi quantises (name, dtype, shape and bytes of each
  tensor, in name order): the same for a safetensors or a PyTorch-bin copy of one model;
- tokenizer: the bytes of tokenizer.json as zoi uses it;
- spec: the ModelSpec as JSON (sorted keys);
- calibration: the calibration texts as used (after dropping empty ones and cutting to
  max_calib_texts), UTF-8, one per line; with their count;
- config: the QuantConfig as JSON (sorted keys), and the zoi version.
`inputs_digest` hashes all of these together.
"""

from __future__ import annotations

import hashlib
import json


def _h(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def weights_digest(weights: dict) -> str:
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name])
        head = json.dumps([name, a.dtype.str, list(a.shape)]).encode()
        h.update(len(head).to_bytes(8, "little") + head)
        h.update(a.tobytes())
    return h.hexdigest()


def texts_digest(texts) -> str:
    return _h(*(t.encode("utf-8") for t in texts))


def tokenizer_digest(tokenizer) -> str | None:
    s = getattr(tokenizer, "json", None)
    if isinstance(s, str):
        return _h(s.encode("utf-8"))
    return None


def record(spec, weights: dict, tokenizer, texts, cfg) -> dict:
    """The `inputs` record of an INT8 compile (JSON-able)."""
    from zoi._version import __version__

    spec_d = spec.to_dict() if hasattr(spec, "to_dict") else dict(vars(spec))
    rec = {
        "zoi_version": __version__,
        "weights_sha256": weights_digest(weights),
        "tokenizer_sha256": tokenizer_digest(tokenizer),
        "spec_sha256": _h(json.dumps(spec_d, sort_keys=True, default=str).encode()),
        "calibration_texts": len(texts),
        "calibration_sha256": texts_digest(texts),
        "config_sha256": _h(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()),
    }
    rec["inputs_sha256"] = _h(*(f"{k}={rec[k]}".encode() for k in sorted(rec)))
    return rec
