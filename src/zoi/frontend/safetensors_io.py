"""Read safetensors files memory-mapped with numpy, no torch.

We parse the (tiny) header ourselves instead of `safetensors.safe_open(framework="numpy")`
because that path cannot return BF16 tensors (numpy has no bfloat16) and gives opaque errors
on corrupt files; here every problem names the file and what is wrong. Writing uses the
`safetensors` library.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError
from zoi.frontend.paths import check_file

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # raw bits; widened to float32 on read
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
MAX_HEADER = 100 * 1024 * 1024


class _Duplicate(Exception):
    pass


# A file mapping placed off the huge-page grid (Linux). A file written moments ago (an artifact
# just compiled) sits in the page cache as 2 MiB folios, and the kernel maps a whole such folio
# on the first fault anywhere in it whenever the mapping's address is congruent to its file
# offset modulo 2 MiB, which it chooses for every mapping of 2 MiB or more. A table read a row
# per token (the CPU engine's word embeddings) then makes up to 2 MiB resident per lookup
# (11 MB of MiniLM's 11.7 MB INT8 table for one 128-token text); one page off the grid, a
# lookup maps only the fault-around window (64 KiB) of pages already cached. Same bytes.
_HUGE = 2 << 20
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)  # Linux's value (Python 3.11 does not name it)


class _OffGridMap:
    """[offset, offset + length) of a file, read-only and shared, at a virtual address one
    page off its file offset's 2 MiB alignment; unmapped when the last array over it goes
    (numpy keeps this object as the arrays' base, through __array_interface__)."""

    def __init__(self, libc, addr: int, span: int):
        self._libc, self.addr, self.span = libc, addr, span
        self.__array_interface__ = {
            "data": (addr, True),
            "shape": (span,),
            "typestr": "|u1",
            "version": 3,
        }

    def __del__(self):
        try:
            self._libc.munmap(self.addr, self.span)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the process unmaps it anyway
            pass

    @staticmethod
    def create(path, offset: int, length: int) -> _OffGridMap | None:
        """None where the platform gives no such mapping (the caller keeps its own)."""
        import ctypes
        import sys

        if not sys.platform.startswith("linux") or length <= 0:
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            mmap_ = libc.mmap
        except (OSError, AttributeError):
            return None
        mmap_.restype = ctypes.c_void_p
        mmap_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
        mmap_.argtypes += [ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        page = mmap.PAGESIZE
        span = length + (-length) % page
        failed = ctypes.c_void_p(-1).value
        # reserve room, place the file one page past a 2 MiB boundary + its offset's phase,
        # give back the rest of the reservation
        room = span + 2 * _HUGE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
        res = mmap_(None, room, 0, flags, -1, 0)  # PROT_NONE: address space only
        if res is None or res == failed:
            return None
        want = -(-res // _HUGE) * _HUGE + offset % _HUGE + page
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY)
            got = mmap_(want, span, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, offset)
        except OSError:
            got = None
        finally:
            if fd >= 0:
                os.close(fd)
        if got != want:
            libc.munmap(res, room)
            return None
        libc.munmap(res, want - res)
        libc.munmap(want + span, res + room - want - span)
        return _OffGridMap(libc, want, span)


def _int(v) -> int:
    if type(v) is not int:
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


class SafetensorsFile:
    """One .safetensors file: `names()`, `meta(name)`, `get(name) -> np.ndarray`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        size = check_file(self.path)  # a regular file (a FIFO would block open()), its size
        try:
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise CheckpointError(
                        f"{self.path}: truncated safetensors file ({size} bytes, no header)"
                    )
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER or 8 + n > size:
                    raise CheckpointError(
                        f"{self.path}: corrupt safetensors header (declares {n} header bytes, file has {size})"
                    )
                raw = f.read(n)
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read ({e.strerror or e})") from e
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except _Duplicate as e:
            raise CheckpointError(
                f"{self.path}: corrupt safetensors header (tensor {e.args[0]!r} is named twice)"
            ) from None
        except RecursionError:
            raise CheckpointError(
                f"{self.path}: corrupt safetensors header (nested too deeply)"
            ) from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{self.path}: corrupt safetensors header (not JSON: {e})") from e
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: corrupt safetensors header (not a JSON object)")
        self.metadata = header.pop("__metadata__", None) or {}
        self._base = 8 + n
        data_len = size - self._base
        self._info: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            try:
                dtype = info["dtype"]
                shape = tuple(_int(s) for s in info["shape"])
                begin, end = (_int(o) for o in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as e:
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} has a malformed header entry"
                ) from e
            if dtype not in _DTYPES:
                raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported dtype {dtype}")
            if any(s < 0 for s in shape):
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} has a negative dimension {shape}"
                )
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
            if not (0 <= begin <= end <= data_len) or end - begin != nbytes:
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} data [{begin}, {end}) does not fit its shape {shape} "
                    f"{dtype} or the file's {data_len} data bytes (truncated or corrupt file)"
                )
            self._info[name] = (dtype, shape, begin, end)
        # As the safetensors format requires (and its library checks): the tensors tile the
        # data buffer exactly, in some order: no two share bytes, no byte belongs to none.
        pos = 0
        for name, (_, _, begin, end) in sorted(self._info.items(), key=lambda kv: kv[1][2:]):
            if begin != pos:
                what = "overlaps the tensor before it" if begin < pos else "leaves a gap before it"
                raise CheckpointError(
                    f"{self.path}: corrupt safetensors header: tensor {name!r} at [{begin}, {end}) "
                    f"{what} (which ends at {pos})"
                )
            pos = end
        if pos != data_len:
            raise CheckpointError(
                f"{self.path}: corrupt safetensors header: the tensors cover {pos} of the "
                f"file's {data_len} data bytes"
            )
        self._mm: np.memmap | None = None

    def names(self) -> list[str]:
        return list(self._info)

    def meta(self, name: str) -> tuple[str, tuple[int, ...]]:
        d, s, _, _ = self._info[name]
        return d, s

    def _map(self) -> np.ndarray:
        if self._mm is None:
            if self.path.stat().st_size == self._base:
                self._mm = np.zeros(0, np.uint8)
            else:
                self._mm = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self._base)
        return self._mm

    def release(self, name: str | None = None) -> None:
        """Unmap from this process the pages of tensor `name` (every tensor: None) that were
        read through the mapping. They stay in the page cache and come back on the next
        access, so nothing changes for a reader; what was read once to verify or to pack for
        the kernels stops counting in the process's memory (a loaded artifact would otherwise
        hold its file twice: mapped, and packed)."""
        mm = self._mm
        mmo = getattr(mm, "_mmap", None)
        if mmo is None or not hasattr(mmo, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        lead = self._base % mmap.ALLOCATIONGRANULARITY  # where the data starts in the map
        if name is None:
            start, stop = 0, len(mmo)
        else:
            _, _, begin, end = self._info[name]
            start, stop = lead + begin, lead + end
        page = mmap.PAGESIZE
        start -= start % page
        # whole pages only: a page shared with a neighbour is dropped too (it comes back)
        stop = min(len(mmo), stop + (-stop) % page)
        if stop > start:
            try:
                mmo.madvise(mmap.MADV_DONTNEED, start, stop - start)
            except (OSError, ValueError):  # advice only: the mapping stays valid either way
                pass

    def row_table(self, name: str) -> np.ndarray | None:
        """Tensor `name` (a float32 or int8 table read a row at a time, at random: the CPU
        engine's word embeddings) in a mapping of its own, off the huge-page grid (see
        _OffGridMap), or None where there is none to give (the caller keeps get()'s)."""
        dtype, shape, begin, end = self._info[name]
        if dtype not in ("F32", "I8") or end <= begin:
            return None
        page = mmap.PAGESIZE
        start = self._base + begin
        lo = start - start % page
        m = _OffGridMap.create(self.path, lo, self._base + end - lo)
        if m is None:
            return None
        raw = np.asarray(m)[start - lo : start - lo + (end - begin)]
        arr = raw.view(_DTYPES[dtype]).reshape(shape)
        arr.flags.writeable = False
        return arr

    def get(self, name: str, float32: bool = True) -> np.ndarray:
        """The tensor, memory-mapped; float tensors widened to float32 when float32=True."""
        dtype, shape, begin, end = self._info[name]
        raw = self._map()[begin:end]
        arr = (
            np.frombuffer(raw, dtype=_DTYPES[dtype]).reshape(shape)
            if end > begin
            else np.zeros(shape, _DTYPES[dtype])
        )
        if dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        elif float32 and dtype in ("F16", "F64"):
            arr = arr.astype(np.float32)
        return arr


def save_safetensors(
    tensors: dict[str, np.ndarray], path: str | os.PathLike, metadata: dict | None = None
) -> None:
    from safetensors.numpy import save_file

    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=metadata
    )
    if metadata and len(metadata) > 1:
        _sort_metadata_in_place(path)


def _sort_metadata_in_place(path: str | os.PathLike) -> None:
    """safetensors writes `__metadata__` from a hash map: its key order changes from process
    to process, and so would the bytes of two saves of one model (reproducible
    artifacts). Rewrite the header with the metadata keys sorted: same JSON length (only
    the order changes), tensors untouched."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        raw = f.read(n)
        text = raw.decode("utf-8")
        body = text.rstrip(" ")
        head = json.loads(body)  # keeps the tensors' order
        md = head.get("__metadata__")
        if not md:
            return
        head["__metadata__"] = {k: md[k] for k in sorted(md)}
        new = json.dumps(head, separators=(",", ":"), ensure_ascii=False)
        if len(new.encode("utf-8")) != len(body.encode("utf-8")):  # another writer's spacing
            return
        f.seek(8)
        f.write((new + text[len(body) :]).encode("utf-8"))
