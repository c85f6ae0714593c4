"""One runner for the server processes zoi starts: `zoi serve` for the load generator and the
tests, `zoi deploy ray`, `tritonserver`.

Each is a child whose log lines are pumped by a thread (kept in memory, optionally copied to a
file), which says it is ready in one of those lines or answers a probe, and which stops on
SIGTERM within a bound, then is killed (with its whole process group when it was started in
a session of its own, so that a local Ray or Triton's backend stubs go with it).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable


class ChildServer:
    """cmd started at once; `lines` fills as the child writes. merge_stdout: read stdout with
    stderr merged into it (a program that logs on stdout), else stderr alone (stdout
    discarded). session: the child leads a new process group, killed as a whole."""

    def __init__(
        self,
        cmd: list[str],
        env: dict | None = None,
        log_path: str | os.PathLike | None = None,
        merge_stdout: bool = False,
        session: bool = False,
    ):
        self.lines: list[str] = []
        self._log = open(log_path, "w") if log_path else None  # noqa: SIM115
        self._session = session
        self._line_seen = threading.Condition()
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE if merge_stdout else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if merge_stdout else subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=session,
        )
        self._stream = self.proc.stdout if merge_stdout else self.proc.stderr
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line)
            if self._log:
                self._log.write(line)
                self._log.flush()
            with self._line_seen:
                self._line_seen.notify_all()
        with self._line_seen:
            self._line_seen.notify_all()

    def wait_for_line(self, pattern: re.Pattern | str, timeout: float) -> re.Match | None:
        """The first match of pattern in the log, waiting up to timeout seconds; None when the
        time runs out or the child ends first."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        with self._line_seen:
            while True:
                for line in self.lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or not self._pump.is_alive():
                    return None
                self._line_seen.wait(min(left, 0.5))

    def wait_until(self, probe: Callable[[], bool], timeout: float, every: float = 0.25) -> bool:
        """probe() until it is true (True), the child ends or the time runs out (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if probe():
                return True
            time.sleep(every)
        return False

    def log(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        """SIGKILL now (the whole group of a session child)."""
        try:
            if self._session:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, up to timeout seconds to exit, then kill; a session child's group is killed
        after it exits too (what it started and left behind). Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._session:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._pump.join(5)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
