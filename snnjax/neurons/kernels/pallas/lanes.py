"""Row loads and stores inside the kernels, masked past M.

M need not be a multiple of the block: the grid has ``cdiv(M, bm)`` programs and the last
one is partial. Every lane is independent (no lane reads another), so the lanes past M
only have to be kept from touching memory. Triton treats block refs as global-memory
pointers and does not bound-check them, so when ``M % bm != 0`` every row load and store
carries the mask ``lane < M`` (``jax.experimental.pallas.triton.load/store``; interpret
mode runs the same masked code). No copy of the data is padded, and no extra bytes move.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton


class Lanes:
    """Loads and stores of ``[bm]`` rows of one program's block (build it inside the kernel)."""

    def __init__(self, m: int, bm: int):
        self.mask = None
        if m % bm:
            lane = pl.program_id(0) * bm + jax.lax.broadcasted_iota(jnp.int32, (bm,), 0)
            self.mask = lane < m

    def _row(self, ref, t):
        if t is None:
            return ref
        if self.mask is not None:
            # The masked load/store's interpret-mode discharge (jax 0.10) fails on constant indices and
            # on indices of another int type than the block's offsets: pass a traced index (folded by
            # the GPU compiler) of the default int type.
            t = jnp.asarray(t + 0 * pl.program_id(0) if isinstance(t, int) else t, dtype=int)
        return ref.at[t]

    def load(self, ref, t=None):
        """``ref[t]`` (a row of a ``[T, bm]`` block), or the whole ``[bm]`` block when t is None."""
        ref = self._row(ref, t)
        if self.mask is None:
            return ref[...]
        return pl_triton.load(ref, mask=self.mask)

    def store(self, ref, value, t=None):
        """``ref[t] = value`` (or the whole ``[bm]`` block when t is None), masked past M."""
        ref = self._row(ref, t)
        if self.mask is None:
            ref[...] = value
            return
        pl_triton.store(ref, value, mask=self.mask)
