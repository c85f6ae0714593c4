"""Fixtures of the scale-out tests: a MiniLM artifact, the Triton environment, and the engine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def artifact(tmp_path_factory) -> Path:
    """The bundled all-MiniLM-L6-v2, compiled (fp32, CPU) and saved as an artifact."""
    import zoi

    out = tmp_path_factory.mktemp("artifact") / "minilm"
    zoi.compile(device="cpu").save(out)
    return out


@pytest.fixture(scope="session")
def engine(artifact):
    import zoi

    return zoi.load(artifact, device="cpu")


@pytest.fixture(scope="session")
def triton_venv() -> Path:
    """The Triton environment (scripts/triton_env.sh: cached, built on first use)."""
    venv = Path(os.environ.get("ZOI_TRITON_VENV") or REPO / ".venv-triton")
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "triton_env.sh"), str(venv)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, (
        f"scripts/triton_env.sh failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return venv


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    """Distinct texts: fragments, real sentences, multi-sentence paragraphs (some truncated)."""
    p = REPO / "src" / "zoi" / "data" / "eval.txt"
    base = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    rng = np.random.default_rng(seed)
    out, seen, i = [], set(), 0
    while len(out) < n:
        r = rng.random()
        s = base[i % len(base)]
        if r < 0.3:
            w = s.split()
            a = int(rng.integers(0, max(1, len(w) - 1)))
            t = " ".join(w[a : a + int(rng.integers(1, 5))])
        elif r < 0.9:
            t = s
        else:
            t = " ".join(base[(i + j) % len(base)] for j in range(int(rng.integers(2, 12))))
        i += 1
        if t and t not in seen:
            seen.add(t)
            out.append(t)
    return out
