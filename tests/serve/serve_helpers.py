"""Helpers of the server tests: which device, real texts, cosine, a raw socket for slow uploads."""

from __future__ import annotations

import functools
import json
import os
import re
import socket
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "all-MiniLM-L6-v2"
FAIL_TOKEN = 1  # [unused0] in the BERT vocabulary: no text ever tokenises to it (fault injection)


@functools.lru_cache(maxsize=1)
def serve_device() -> str:
    """The native CPU engine when it is built, else the numpy reference engine (slower, smaller loads)."""
    forced = os.environ.get("ZOI_TEST_SERVE_DEVICE")
    if forced:
        return forced
    try:
        import zoi

        zoi.compile(device="cpu", max_tokens=256)
        return "cpu"
    except Exception:
        return "reference"


def real_sentences() -> list[str]:
    p = REPO / "src" / "zoi" / "data" / "eval.txt"
    if p.exists():
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if len(lines) >= 50:
            return lines
    from zoi.bench.loadtest import make_texts

    return make_texts(300, seed=1)


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    """Real sentences, short fragments and multi-sentence paragraphs (some over 256 tokens)."""
    base = real_sentences()
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.3:
            words = base[i % len(base)].split()
            out.append(" ".join(words[: max(1, int(rng.integers(1, 6)))]))
        elif r < 0.85:
            out.append(base[i % len(base)])
        else:
            k = int(rng.integers(2, 16))
            out.append(" ".join(base[(i + j) % len(base)] for j in range(k)))
    return out


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def metric(text: str, name: str, labels: str | None = None) -> float:
    key = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "")
    m = re.search(rf"^{key} ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def host_port(url: str) -> tuple[str, int]:
    hp = url.split("://", 1)[1].rstrip("/")
    host, port = hp.rsplit(":", 1)
    return host, int(port)


class SlowUpload:
    """A POST whose body is sent in two parts: the server admits it, then waits for the rest."""

    def __init__(self, url: str, path: str, body: dict, split: int = 5):
        self.data = json.dumps(body).encode()
        self.sock = socket.create_connection(host_port(url), timeout=60)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(self.data)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + self.data[:split])
        self.split = split

    def finish(self) -> tuple[int, bytes]:
        self.sock.sendall(self.data[self.split :])
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"content-length: (\d+)", head, re.I)
        n = int(m.group(1)) if m else 0
        while len(rest) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        self.sock.close()
        return status, rest

    def abort(self) -> None:
        self.sock.close()
