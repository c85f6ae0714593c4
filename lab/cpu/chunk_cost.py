"""Host cost per chunk of the pipelined encode, without the forward:
`python lab/cpu/chunk_cost.py`. The CPU backend's run_into replaced by a stub that only fills its
output; 1000 real texts of mixed lengths encoded with batch_size=1 (1000 chunks) and with the
default chunks, against the tokenizer alone (one thread). The calling thread's CPU time
(thread_time), so that load from other processes does not inflate it; p25 of 15 calls."""

from __future__ import annotations

import time

import numpy as np


def main() -> None:
    import zoi
    from zoi.bench.text import Tok, natural_texts
    from zoi.engine import default_model_path

    m = str(default_model_path())
    texts = natural_texts(Tok(m), 1000, max_len=256)
    e = zoi.compile(m, device="cpu", precision="fp32")
    e.backend.run_into = lambda i, p, c, n, o: o.fill(0.0)
    nat = e.tokenizer.native

    def tm(f, n=15):
        ts = []
        for _ in range(n):
            t0 = time.thread_time_ns()
            f()
            ts.append(time.thread_time_ns() - t0)
        return float(np.percentile(ts, 25)) / 1e3

    for _ in range(2):
        tok = tm(lambda: nat.encode_packed(texts, True, 0, 1))
        one = tm(lambda: e.encode(texts, batch_size=1))
        big = tm(lambda: e.encode(texts))
        print(
            f"tokenizer alone (1 thread) {tok:.0f} us | encode, 1000 chunks {one:.0f} us = "
            f"{(one - tok) / 1000:.2f} us per chunk more | encode, default chunks {big:.0f} us"
        )


if __name__ == "__main__":
    main()
