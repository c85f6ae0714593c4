"""The per-call path: host staging of one call's inputs and output, and the driver-API
sequence that runs a captured bucket (no framework, no allocation per call).

``HostStaging``: the input ints [header (normalize, B, T, 0) + cu_seqlens | ids | positions]
and the pooled [B, out_dim] fp32 output, in page-locked memory (plain numpy arrays in the
interpreter, where "device" buffers are torch CPU tensors).

``DriverCall.run``: ``cuMemcpyHtoDAsync`` of the staged ints, ``cuGraphLaunch``,
``cuMemcpyDtoHAsync`` of the output (and, for a persistent bucket, of its 8-byte barrier
error flag), ``cuStreamSynchronize``. The caller holds the backend's lock.
"""

from __future__ import annotations

import numpy as np


class HostStaging:
    def __init__(self, drv, in_ints: int, hdr_ints: int, max_batch: int, hidden: int):
        """drv: zoi.backends.cuda.driver (pinned memory), or None (interpreter: numpy);
        hidden: the width of an output row (the model's out_dim)."""
        self.hdr_ints, self.in_ints = hdr_ints, in_ints
        self.pinned = drv is not None
        if self.pinned:
            self.p_in = drv.Pinned(in_ints * 4)
            self.p_out = drv.Pinned(max_batch * hidden * 4)
            self.p_flag = drv.Pinned(8)  # a persistent bucket's barrier error flag
            self.h_in = self.p_in.view(np.int32, 0, in_ints)
            self.h_out = self.p_out.view(np.float32, 0, max_batch * hidden).reshape(
                max_batch, hidden
            )
            self.h_flag = self.p_flag.view(np.int64, 0, 1)
            self.h_in[:] = 0
            self.h_flag[0] = 0
        else:
            self.h_in = np.zeros(in_ints, np.int32)
            self.h_out = np.zeros((max_batch, hidden), np.float32)
            self.h_flag = np.zeros(1, np.int64)

    @property
    def nbytes(self) -> int:
        return int(self.h_in.nbytes + self.h_out.nbytes + 8) if self.pinned else 0

    def layout(self, tb: int) -> tuple[int, int, int]:
        """(ids offset, positions offset, ints to copy) for bucket tb."""
        return self.hdr_ints, self.hdr_ints + tb, self.hdr_ints + 2 * tb

    def stage(self, ids, positions, cu_seqlens, normalize, tb) -> tuple[int, int]:
        """Write one call (padded to bucket tb) into the input staging: (ints to copy, B)."""
        T, B = len(ids), len(cu_seqlens) - 1
        io, po, n = self.layout(tb)
        h = self.h_in
        h[0], h[1], h[2] = 1 if normalize else 0, B, T
        h[4 : 4 + B + 1] = cu_seqlens
        h[io : io + T] = ids
        h[io + T : io + tb] = 0
        h[po : po + T] = positions
        h[po + T : po + tb] = 0
        return n, B

    def free(self) -> None:
        if self.pinned:
            for p in (self.p_in, self.p_out, self.p_flag):
                p.free()


class DriverCall:
    """The driver-API sequence of one call on the backend's own stream."""

    def __init__(self, drv, ctx, stream, d_in, d_out):
        self.drv, self.cu, self.check = drv, drv.cu, drv.check
        self.ctx, self.stream = ctx, stream
        self.d_in_ptr = drv.cu.CUdeviceptr(d_in.data_ptr())
        self.d_out_ptr = drv.cu.CUdeviceptr(d_out.data_ptr())
        self.hidden = int(d_out.shape[1])

    def enqueue(self, st: HostStaging, gexec, n: int, B: int, flag=None) -> None:
        """Copies in, graph, copies out, on the stream (nothing waits here). flag: the
        persistent forward's device error flag (a torch int64 view) or None."""
        cuda, chk, s = self.cu, self.check, self.stream
        chk(cuda.cuCtxSetCurrent(self.ctx))
        chk(cuda.cuMemcpyHtoDAsync(self.d_in_ptr, st.p_in.ptr, n * 4, s))
        chk(cuda.cuGraphLaunch(gexec, s))
        chk(cuda.cuMemcpyDtoHAsync(st.p_out.ptr, self.d_out_ptr, B * self.hidden * 4, s))
        if flag is not None:  # 8 bytes, same stream
            chk(cuda.cuMemcpyDtoHAsync(st.p_flag.ptr, cuda.CUdeviceptr(flag.data_ptr()), 8, s))

    def run(self, st: HostStaging, gexec, n: int, B: int, flag=None) -> bool:
        """One synchronous call; True when the barrier flag came back set (result void)."""
        self.enqueue(st, gexec, n, B, flag)
        self.check(self.cu.cuStreamSynchronize(self.stream))
        return flag is not None and st.h_flag[0] != 0
