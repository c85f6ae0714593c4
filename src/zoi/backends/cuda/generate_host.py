"""The host's half of GenerateRuntime (a mixin, zoi.backends.cuda.generate): the pinned staging
block and its copies, the block-table rows marked dirty, one generation step (packed prefill of new
prompts, one decode graph launch for the running rows), the decode step launched ahead, the tokens'
copy back, graph timing and the memory report. Kept apart from the weights and buffers
(generate.py) and the launch lists (generate_steps.py) so that each file reads as one concern.
"""

from __future__ import annotations

import numpy as np

from zoi.backends.cuda.generate_steps import _FIELDS
from zoi.errors import BackendUnavailableError


class GenerateHost:
    def _h2d(self, n_ints: int, offset: int = 0):
        if self.eager:
            self.d_stage[offset : offset + n_ints] = self.torch.from_numpy(
                self.h_stage[offset : offset + n_ints].copy()
            )
            return
        dst = self.cu.CUdeviceptr(self.d_stage.data_ptr() + offset * 4)
        self.drv.check(
            self.cu.cuMemcpyHtoDAsync(dst, self.p_stage.ptr + offset * 4, n_ints * 4, self.stream)
        )

    def _sync_tables(self):
        """Copy the block-table rows marked dirty (mark_dirty) to the device table."""
        if not self._dirty:
            return
        dirty = sorted(self._dirty)
        self._dirty.clear()
        bt = self.block_tables
        if self.eager:
            self.tab[: self.max_batch] = self.torch.from_numpy(bt.copy())
            return
        self.h_tab[dirty] = bt[dirty]
        row = self.tab_host.shape[1] * 4
        for r in dirty:
            dst = self.cu.CUdeviceptr(self.tab.data_ptr() + int(r) * row)
            self.drv.check(
                self.cu.cuMemcpyHtoDAsync(dst, self.p_tab.ptr + int(r) * row, row, self.stream)
            )

    def mark_dirty(self, row: int) -> None:
        """Block-table row `row` changed on the host: copied to the device before the next step."""
        self._dirty.add(int(row))

    def _stage_pad(self, B: int, n: int, base: int = 0, h=None):
        """Padding entries n..B of the decode fields: token 0 at position 0 in the trash block."""
        MB = self.max_batch
        h = self.h_stage if h is None else h
        for name, val in (
            ("ids", 0),
            ("pos", 0),
            ("slot", self.trash_slot),
            ("ctx", 1),
            ("rix", MB),
            ("seed", 0),
            ("step", 0),
            ("topk", 0),
            ("temp", 0),
            ("topp", 0),
            ("fb", -1),
        ):
            i = _FIELDS.index(name)
            h[base + i * MB + n : base + i * MB + B] = val

    def _stage_sampling(self, base: int, idx, samp, seeds, h=None):
        MB = self.max_batch
        h = self.h_stage if h is None else h
        n = len(idx)

        def put(name, arr):
            i = _FIELDS.index(name)
            h[base + i * MB : base + i * MB + n] = arr

        put("seed", (seeds[idx] ^ (seeds[idx] >> np.uint64(32))).astype(np.uint32).view(np.int32))
        put("step", samp[idx, 3].astype(np.int32))
        put("topk", samp[idx, 1].astype(np.int32))
        put("temp", samp[idx, 0].astype(np.float32).view(np.int32))
        put("topp", samp[idx, 2].astype(np.float32).view(np.int32))

    def run_step(self, rows, starts, counts, ids, samp, seeds) -> np.ndarray:
        """One generation step, as the CPU engine's run_gen: new prompts (starts == 0) prefilled
        packed, in groups of max_prefill tokens; the running sequences (one pending token each)
        one decode step of the smallest bucket that holds them. The next token of each."""
        out = np.empty(len(rows), np.int32)
        offs = np.concatenate([[0], np.cumsum(counts)])
        pre = [i for i in range(len(rows)) if starts[i] == 0]
        dec = [i for i in range(len(rows)) if starts[i] > 0]
        if not self.eager:
            self.drv.check(self.cu.cuCtxSetCurrent(self.ctx))
        self._sync_tables()
        group, tokens = [], 0
        for i in pre:  # packed prefill, in groups of max_prefill tokens
            if group and tokens + counts[i] > self.max_prefill:
                self._prefill(group, rows, counts, ids, offs, samp, seeds, out)
                group, tokens = [], 0
            group.append(i)
            tokens += int(counts[i])
        if group:
            self._prefill(group, rows, counts, ids, offs, samp, seeds, out)
        if dec:
            self._decode(dec, rows, starts, ids, offs, samp, seeds, out)
        return out

    def _slots(self, row, pos: np.ndarray) -> np.ndarray:
        """Pool slots of positions pos of block-table row(s) row (an int, or an array beside pos)."""
        bs = self.block_size
        return self.block_tables[row, pos // bs] * bs + pos % bs

    def _decode(self, dec, rows, starts, ids, offs, samp, seeds, out):
        idx = np.asarray(dec)
        pos = starts[idx].astype(np.int64)
        fb = np.full(len(idx), -1, np.int32)
        B = self._stage_decode(self.h_stage, ids[offs[idx]], pos, rows[idx], fb, idx, samp, seeds)
        self._h2d(self.n_dec)
        self._launch(B)
        out[idx] = self._tokens(len(idx))

    def _stage_decode(self, h, ids, pos, rows, fb, idx, samp, seeds) -> int:
        """Fill the decode fields of staging block h for n = len(pos) rows; returns the bucket."""
        n = len(pos)
        B = next(b for b in self.buckets if b >= n)
        MB = self.max_batch
        # one gather for all rows, not a call per row
        slot = self._slots(rows, pos).astype(np.int32)
        for name, arr in (
            ("ids", ids),
            ("pos", pos),
            ("slot", slot),
            ("ctx", pos + 1),
            ("rix", rows),
            ("fb", fb),
        ):
            i = _FIELDS.index(name)
            h[i * MB : i * MB + n] = arr
        self._stage_sampling(0, idx, samp, seeds, h)
        self._stage_pad(B, n, 0, h)
        return B

    def _launch(self, B: int):
        if self.eager or not self.use_graphs:
            self._eager(self._steps[B])
        else:
            self.drv.check(self.cu.cuGraphLaunch(self._graphs[B][1], self.stream))

    def launch_ahead(self, ids, pos, rows, fb, samp, seeds) -> dict:
        """Stage and launch one decode step of n = len(pos) rows without waiting for it (the
        pipelined steps of the decoder): its tokens come back by wait_ahead. A row with fb[i] >= 0
        takes its id from row fb[i] of the step in flight (on the device)."""
        n = len(pos)
        self.n_ahead += 1
        p = self._parity
        self._parity ^= 1
        h = self.h_ahead[p]
        B = self._stage_decode(h, ids, pos, rows, fb, np.arange(n), samp, seeds)
        if self.eager:
            self.d_stage[: self.n_dec] = self.torch.from_numpy(h.copy())
            self._launch(B)
            return {"toks": self.tok[:n].numpy().copy()}
        cu, chk, buf = self.cu, self.drv.check, self.p_ahead[p]
        chk(cu.cuCtxSetCurrent(self.ctx))
        dst = cu.CUdeviceptr(self.d_stage.data_ptr())
        chk(cu.cuMemcpyHtoDAsync(dst, buf.ptr, self.n_dec * 4, self.stream))
        self._launch(B)
        src = cu.CUdeviceptr(self.tok.data_ptr())
        chk(cu.cuMemcpyDtoHAsync(buf.ptr + self.n_dec * 4, src, n * 4, self.stream))
        chk(cu.cuEventRecord(self.ev_ahead[p], self.stream))
        return {"p": p, "n": n}

    def wait_ahead(self, infl: dict) -> np.ndarray:
        """The tokens of a step launched ahead (waits for it)."""
        if "toks" in infl:
            return infl["toks"]
        p, n = infl["p"], infl["n"]
        self.drv.check(self.cu.cuEventSynchronize(self.ev_ahead[p]))
        return self.p_ahead[p].view(np.int32, self.n_dec * 4, n).copy()

    def drain(self) -> None:
        """Nothing launched ahead here; the decoder's pipelined steps wait for theirs."""

    def _eager(self, steps):
        if self.eager:
            for s in steps:
                s()
            return
        with self.torch.cuda.stream(self.tstream):
            for s in steps:
                s()

    def _tokens(self, n: int, buf=None) -> np.ndarray:
        buf = self.tok if buf is None else buf
        if self.eager:
            return buf[:n].numpy().copy()
        cu = self.cu
        src = cu.CUdeviceptr(buf.data_ptr())
        self.drv.check(cu.cuMemcpyDtoHAsync(self.p_tok.ptr, src, n * 4, self.stream))
        self.drv.check(cu.cuStreamSynchronize(self.stream))
        return self.h_tok[:n].copy()

    def time_decode_graph(self, B: int, ctx: int = 1, n: int = 50) -> float:
        """us per replay of bucket B's decode graph, n back-to-back launches (device-bound), on
        padding rows that attend over ctx tokens of the trash row. Only between steps."""
        import time

        if not self.use_graphs:
            raise BackendUnavailableError(
                "time_decode_graph needs CUDA graphs (a GPU, graphs=True)"
            )
        self.drain()
        B = next(b for b in self.buckets if b >= B)
        self._stage_pad(B, 0)
        i = _FIELDS.index("ctx")
        self.h_stage[i * self.max_batch : i * self.max_batch + B] = max(
            1, min(ctx, self.max_seq_len)
        )
        cu, chk = self.cu, self.drv.check
        self._h2d(self.n_dec)
        gexec = self._graphs[B][1]
        chk(cu.cuGraphLaunch(gexec, self.stream))
        chk(cu.cuStreamSynchronize(self.stream))
        t0 = time.perf_counter()
        for _ in range(n):
            chk(cu.cuGraphLaunch(gexec, self.stream))
        chk(cu.cuStreamSynchronize(self.stream))
        return (time.perf_counter() - t0) / n * 1e6

    def memory(self) -> dict:
        w = [
            x
            for L in self.layers
            for v in L.values()
            if v is not None
            for x in (v if isinstance(v, tuple) else (v,))
            if x is not None
        ]
        w += [x for x in self.lm if x is not None] + [self.emb]
        nb = lambda ts: int(sum(x.numel() * x.element_size() for x in ts))  # noqa: E731
        return {
            "weights_bytes": nb(w),
            "kv_pool_bytes": nb([self.kc, self.vc]),
            # the rest of the one arena: activations (sharing bytes by liveness), workspaces,
            # block tables, staging
            "activation_bytes": self.arena_bytes - nb([self.kc, self.vc]),
            "arena_bytes": self.arena_bytes,
            "buckets": list(self.buckets),
            "graphs": self.use_graphs,
            "pdl": self.pdl,
            "prefetch": self.prefetch,
            "device": self.device_name,
        }
