"""Artifact folders written safely: a save goes to a locked temporary folder beside its
destination and is renamed into place when complete; what a killed save leaves is removed by
the next save of the same artifact once its writer is gone (never a live writer's), and the
folder gets the modes the umask asks for."""

from __future__ import annotations

import logging
import os
import re
import shutil
from glob import escape as glob_escape
from pathlib import Path

log = logging.getLogger("zoi")

# ---- the temporaries of an atomic save ------------------------------------------------------
# Engine.save writes DEST's files into PARENT/.DEST.tmp-PID-XXXXXXXX, then renames it to DEST.
# A writer killed before the rename (SIGKILL, out of memory, power loss) leaves that folder
# behind, as big as the artifact. Before the folder exists its writer creates the sibling
# PARENT/.DEST.tmp-PID-XXXXXXXX.lock and holds an exclusive flock on it until the save ends;
# the kernel drops the lock when the process dies, however it dies. A later save of the same
# DEST removes the temporaries whose lock it can take and whose pid is not a live process, and
# never one whose lock is held (a live writer, in this process or another container).
_TMP_MARK = ".tmp-"
_LOCK_SUFFIX = ".lock"
_TMP_RE = re.compile(r"(\d+)-[0-9a-f]{8}")  # PID-XXXXXXXX after ".DEST.tmp-"
_LEGACY_TMP_RE = re.compile(r"[A-Za-z0-9_]{8}")  # tempfile.mkdtemp's suffix (older zoi)


def _claim_temp(dest: Path) -> tuple[Path, int | None]:
    """A fresh temporary folder for dest, and the fd of the lock held on it (None where the
    filesystem takes no lock: the pid in the name then tells the writer)."""
    import fcntl
    import secrets

    for _ in range(100):
        tmp = dest.parent / f".{dest.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        lock = str(tmp) + _LOCK_SUFFIX
        try:
            fd: int | None = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        except OSError:
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                _release_temp(tmp, fd)
                fd = None
        try:
            os.mkdir(tmp, 0o700)
        except FileExistsError:
            _release_temp(tmp, fd)
            continue
        except BaseException:
            _release_temp(tmp, fd)
            raise
        return tmp, fd
    raise FileExistsError(f"{dest.parent}: no free temporary name for saving {dest.name}")


def _release_temp(tmp: Path, fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.unlink(str(tmp) + _LOCK_SUFFIX)
    except OSError:
        pass
    os.close(fd)  # closing drops the flock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _writer_gone(tmp: Path, pid: int) -> bool:
    """True when the save that made tmp is over: its lock (if any) is free and its pid is
    not a live process here (a reused pid keeps the folder: the safe side)."""
    import fcntl

    try:
        fd = os.open(str(tmp) + _LOCK_SUFFIX, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError:
        return False
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: a live writer
        finally:
            os.close(fd)
    return not _pid_alive(pid)


def _remove_stale_olds(dest: Path) -> None:
    """The previous artifacts (.DEST.old-PID) of saves killed between their two renames: the
    new DEST is in place now, so they are obsolete once their writer is gone."""
    prefix = f".{dest.name}.old-"
    for p in dest.parent.glob(f"{glob_escape(prefix)}*"):
        pid = p.name[len(prefix) :]
        if pid.isdigit() and p.is_dir() and not p.is_symlink() and not _pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def remove_stale_temps(dest: str | os.PathLike) -> list[Path]:
    """Remove what interrupted saves of `dest` left in its parent folder: temporaries (and
    their lock files) whose writer is gone. A live writer's are kept. Returns what was
    removed."""
    dest = Path(dest)
    prefix = f".{dest.name}{_TMP_MARK}"
    removed: list[Path] = []
    try:
        entries = sorted(dest.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        if not p.name.startswith(prefix):
            continue
        rest = p.name[len(prefix) :]
        is_lock = rest.endswith(_LOCK_SUFFIX)
        m = _TMP_RE.fullmatch(rest[: -len(_LOCK_SUFFIX)] if is_lock else rest)
        if m is None:
            if _LEGACY_TMP_RE.fullmatch(rest) and p.is_dir():
                log.warning(
                    "zoi: %s is left from an interrupted save by an older zoi (its name holds "
                    "no writer pid, so it is not removed by itself): delete it once no "
                    "compile writes %s",
                    p,
                    dest,
                )
            continue
        tmp = p.with_name(p.name[: -len(_LOCK_SUFFIX)]) if is_lock else p
        if is_lock and tmp.exists():
            continue  # handled with its folder
        if p.is_symlink() or not _writer_gone(tmp, int(m.group(1))):
            continue
        if not is_lock:
            shutil.rmtree(p, ignore_errors=True)
            log.info("zoi: removed %s, left by an interrupted save of %s", p, dest.name)
        Path(str(tmp) + _LOCK_SUFFIX).unlink(missing_ok=True)
        removed.append(p)
    return removed


def current_umask() -> int:
    """The process umask, read without changing it where /proc says it (else set and reset)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _honour_umask(folder: Path) -> None:
    """mkdtemp makes a 0700 folder (and a tempfile a 0600 file) whatever the umask: give the
    artifact the modes a plain mkdir / open would (0777 / 0666 less the umask), so another
    user or a container can read it when the umask allows."""
    mask = current_umask()
    for f in folder.rglob("*"):
        os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~mask)
    os.chmod(folder, 0o777 & ~mask)
