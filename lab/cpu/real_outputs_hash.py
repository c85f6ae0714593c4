"""Hash of the real INT8 MiniLM embeddings of 200 sentences of src/zoi/data/eval.txt (batches of 32),
under one ISA, from this build or from another `src` tree (main's, exported and built apart): equal
hashes mean bit-identical embeddings, so `zoi eval`'s accuracy figures carry over unchanged.

    python lab/cpu/real_outputs_hash.py ARTIFACT ISA [SRC_TREE]
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

if len(sys.argv) > 3 and sys.argv[3]:
    sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
    sys.path.insert(0, sys.argv[3])
os.environ["ZOI_CPU_ISA"] = sys.argv[2]

import numpy as np  # noqa: E402

import zoi  # noqa: E402

data = Path(__file__).resolve().parents[2] / "src" / "zoi" / "data" / "eval.txt"
texts = [t for t in data.read_text().splitlines() if t.strip()][:200]
e = zoi.load(os.path.expanduser(sys.argv[1]))
out = np.concatenate([e.encode(texts[i : i + 32]) for i in range(0, len(texts), 32)])
digest = hashlib.sha256(np.ascontiguousarray(out, np.float32).tobytes()).hexdigest()[:16]
print(sys.argv[2], out.shape, digest, zoi.__file__)
