"""One provider in one fresh process (``python -m zoi.bench.worker FD``).

Commands arrive as JSON lines on stdin; replies go as JSON lines to the file descriptor FD
(never stdout, where libraries print). Only numpy is imported before ``load``, so the peak
RSS (VmHWM) this process reports is the provider's own.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np


def proc_status() -> dict:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for ln in f:
                k, _, v = ln.partition(":")
                if k in ("VmHWM", "VmRSS"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:  # not Linux: fall back to getrusage (peak only)
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["VmHWM"] = r if sys.platform == "darwin" else r * 1024
    return out


def load_seqs(path: str) -> list[np.ndarray]:
    z = np.load(path)
    ids, cu = z["ids"], z["cu"]
    return [ids[cu[i] : cu[i + 1]].copy() for i in range(len(cu) - 1)]


def save_seqs(path: str, seqs: list[np.ndarray]) -> None:
    cu = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=cu[1:])
    np.savez(path, ids=np.concatenate(seqs).astype(np.int32), cu=cu)


class Worker:
    def __init__(self):
        self.p = None
        self.prepared = {}

    def op_load(self, c):
        from zoi.bench.providers import BY_NAME, instantiate

        t = time.perf_counter()
        spec = BY_NAME[c["provider"]]
        self.p = instantiate(
            spec,
            model_dir=c["model_dir"],
            artifacts=c["artifacts"],
            threads=c["threads"],
            max_tokens=c["max_tokens"],
            max_batch=c.get("max_batch", 256),
        )
        self.p.load()
        return {"load_s": time.perf_counter() - t, "status": proc_status()}

    def op_prepare(self, c):
        if c.get("text"):  # texts in (a JSON list): the provider tokenises inside the call
            with open(c["file"], encoding="utf-8") as f:
                texts = json.load(f)
            prep = self.p.prepare_texts(texts, c["n_batches"])
            self.prepared[c["key"]] = (self.p.call_texts, prep)
        else:
            self.prepared[c["key"]] = (
                self.p.call,
                self.p.prepare(load_seqs(c["file"]), c["n_batches"]),
            )
        call, prep = self.prepared[c["key"]]
        out = call(prep)  # first call: shape checks, lazy init
        out = np.asarray(out)
        if out.ndim != 2 or out.shape[0] != c["n_seqs"] or not np.isfinite(out).all():
            raise RuntimeError(f"bad output {out.shape} (want [{c['n_seqs']}, H], finite)")
        return {"shape": list(out.shape)}

    def op_time(self, c):
        """``n`` calls, or until ``seconds`` are spent when given (warm-up); ns per call."""
        call, prep = self.prepared[c["key"]]
        clock = time.perf_counter_ns
        ns = []
        limit = c.get("seconds")
        t_end = clock() + int(limit * 1e9) if limit is not None else None
        n = c["n"]
        for i in range(n):
            t0 = clock()
            call(prep)
            t1 = clock()
            ns.append(t1 - t0)
            if t_end is not None and t1 > t_end and i + 1 >= c.get("min_n", 1):
                break
        time.sleep(c.get("settle", 0.0))  # let this library's spinning threads go to sleep
        return {"ns": ns}

    def op_drop(self, c):
        self.prepared.pop(c["key"], None)
        return {}

    def op_embed(self, c):
        emb = self.p.embed(load_seqs(c["file"]), c["batch"])
        np.save(c["out"], np.asarray(emb, dtype=np.float32))
        return {"shape": list(emb.shape)}

    def op_env(self, c):
        """The named environment variables as this worker sees them (tests: --peer-isa)."""
        return {"env": {k: os.environ.get(k) for k in c["keys"]}}

    def op_memory(self, c):
        # the status first: what a provider does to measure itself (PyTorch serialises its
        # weights) is not part of the peak it loads and runs in
        status = proc_status()
        return {"provider": self.p.memory() if self.p else {}, "status": status}


def main() -> None:
    fd = int(sys.argv[1])
    reply = os.fdopen(fd, "w", buffering=1)
    w = Worker()
    for line in sys.stdin:
        c = json.loads(line)
        if c["op"] == "quit":
            break
        try:
            r = getattr(w, "op_" + c["op"])(c)
            r["ok"] = True
        except BaseException as e:  # report, keep serving (the parent decides)
            r = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        reply.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
