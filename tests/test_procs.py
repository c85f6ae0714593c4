"""The one runner of server processes (zoi.procs.ChildServer): ready lines, probes, bounded
stops, and a session child's whole group ended with it."""

from __future__ import annotations

import os
import sys
import time

from zoi.procs import ChildServer

PY = sys.executable


def _child(code: str, **kw) -> ChildServer:
    return ChildServer([PY, "-u", "-c", code], **kw)


def test_ready_line_is_found_and_the_log_kept(tmp_path):
    log = tmp_path / "child.log"
    code = (
        "import sys, time; print('starting', file=sys.stderr); time.sleep(0.3); "
        "print('ready on http://x:1', file=sys.stderr); time.sleep(30)"
    )
    with _child(code, log_path=log) as c:
        m = c.wait_for_line(r"ready on (\S+)", 20)
        assert m is not None and m.group(1) == "http://x:1"
        assert "starting" in c.log()
    assert c.proc.returncode is not None  # stopped on exit
    assert "ready on" in log.read_text()


def test_a_child_that_ends_before_ready_gives_none_at_once():
    c = _child("import sys; print('boom', file=sys.stderr); sys.exit(3)")
    t0 = time.monotonic()
    assert c.wait_for_line("ready", 30) is None
    assert time.monotonic() - t0 < 10
    assert c.stop() == 3 and "boom" in c.log()


def test_stdout_merged_for_programs_that_log_there():
    with _child("print('ready on stdout'); import time; time.sleep(30)", merge_stdout=True) as c:
        assert c.wait_for_line("ready on stdout", 20) is not None


def test_a_child_ignoring_sigterm_is_killed_after_the_bound():
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', file=sys.stderr); time.sleep(60)"
    )
    c = _child(code)
    assert c.wait_for_line("up", 20)
    t0 = time.monotonic()
    c.stop(timeout=1.0)
    assert time.monotonic() - t0 < 10 and c.proc.returncode is not None


def test_a_session_childs_group_goes_with_it(tmp_path):
    """A grandchild (a local Ray's process, a backend stub) is ended with its session."""
    pidfile = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); "
        "print('up', file=sys.stderr); time.sleep(60)"
    )
    c = _child(code, session=True)
    assert c.wait_for_line("up", 20)
    grandchild = int(pidfile.read_text())
    c.stop(timeout=5)
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the session's grandchild outlived the stop")


def test_wait_until_stops_when_the_child_ends():
    c = _child("import time; time.sleep(0.2)")
    assert c.wait_until(lambda: False, 20) is False  # ended: no 20 s wait
    c.stop()
    seen = []
    with _child("import time; time.sleep(30)") as c2:
        assert c2.wait_until(lambda: seen.append(1) or len(seen) > 2, 20, every=0.01)
