"""Programmatic dependent launch (PDL) for the decoder's kernels.

A decode step is ~150 small launches in one CUDA graph; without PDL each one starts only after
the previous grid has finished and its launch latency is paid in full. With PDL (sm_90+; the
launch attribute programmatic stream serialization, set by Triton's ``launch_pdl=True``) a kernel
may be scheduled while its predecessor still runs:

* ``pdl_begin`` runs first in every kernel: ``griddepcontrol.wait`` (returns once the previous
  grid has completed and its writes are visible), then ``griddepcontrol.launch_dependents`` (the
  next kernel may be scheduled as soon as every program of this one has reached it). Because every
  kernel waits before it reads or writes anything that another kernel touches, completion is
  transitive along the stream: kernel i + 2 runs after kernel i has finished, as without PDL.
* ``prefetch_l2`` may run *before* the wait: the weights of a linear do not depend on any kernel,
  so the program asks the copy engine to bring its own W slice into L2
  (``cp.async.bulk.prefetch.L2``: one instruction per contiguous row range) while the previous
  kernel finishes; the main loop then reads W from L2.

Neither is available under the Triton interpreter (inline PTX): the backends pass PDL=False there.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_begin(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(row_ptrs, nbytes):
    """Bulk-prefetch nbytes from each address of row_ptrs (a 1-D pointer tensor; addresses and
    nbytes multiples of 16) into L2. A hint: nothing waits for it."""
    n = tl.zeros(row_ptrs.shape, dtype=tl.int32) + nbytes
    tl.inline_asm_elementwise(
        "mov.u32 $0, 0;\n\tcp.async.bulk.prefetch.L2.global [$1], $2;",
        "=r,l,r",
        [row_ptrs.to(tl.int64), n],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def can_prefetch(w, K: int) -> bool:
    """W [N, K] rows start at 16-byte multiples (cp.async.bulk's alignment)."""
    return (K * w.element_size()) % 16 == 0 and w.data_ptr() % 16 == 0


__all__ = ["pdl_begin", "prefetch_l2", "can_prefetch"]
