"""The parent's side of a worker process: start it, send a command, wait for the reply."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path


class WorkerError(RuntimeError):
    pass


def worker_env(threads: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})  # e.g. --peer-isa's ISA caps for this provider's library
    t = str(threads)
    for k in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "ZOI_NUM_THREADS",
        "ZOI_THREADS",
    ):
        env[k] = t
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("PYTHONWARNINGS", "ignore")
    # same interpreter, same environment: the worker imports zoi exactly as the parent did
    # (an editable install's import hook included; never prepend the source tree to PYTHONPATH)
    return env


class WorkerProc:
    def __init__(self, threads: int, log_path: Path, env: dict | None = None):
        r, w = os.pipe()
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zoi.bench.worker", str(w)],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=self.log,
            pass_fds=(w,),
            env=worker_env(threads, env),
            text=True,
        )
        os.close(w)
        self.r = os.fdopen(r, "r")
        self.pid = self.proc.pid

    def request(self, timeout: float = 900.0, **cmd) -> dict:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"worker died before {cmd['op']}: {self.tail()}") from e
        ready, _, _ = select.select([self.r], [], [], timeout)
        if not ready:
            self.kill()
            raise WorkerError(f"worker timed out after {timeout:.0f}s on {cmd['op']}")
        line = self.r.readline()
        if not line:
            raise WorkerError(
                f"worker exited during {cmd['op']} (rc={self.proc.poll()}): {self.tail()}"
            )
        rep = json.loads(line)
        if not rep.get("ok"):
            raise WorkerError(rep.get("error", "unknown error") + "\n" + rep.get("trace", ""))
        return rep

    def tail(self, n: int = 1500) -> str:
        try:
            self.log.flush()
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
        except Exception:
            self.kill()
        finally:
            self.r.close()
            self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
