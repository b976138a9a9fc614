"""Fused multi-timestep forward kernel of IF / LIF / PLIF over time-major ``[T, M]`` data.

One program per block of ``bm`` neurons (a 1-D grid over M). It reads ``V_init`` once,
keeps V in registers through a ``fori_loop`` over the T steps, and per step reads one row
of X and writes one row of spikes (and of V when the sequence is wanted). The charge
and reset are the XLA path's own functions (``functional.charge`` / ``reset``), so the
operation order, hence every spike, is the same. A partial last block is handled by
``lanes.Lanes`` (masked rows for Triton).
"""
from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl

from snnjax.neurons import functional as F
from snnjax.pallas.lanes import Lanes
from snnjax.pallas.options import KernelOptions


def _kernel(cfg: F.NeuronConfig, T: int, return_v_seq: bool, m: int, masked: bool, x_ref, v0_ref, *refs):
    if cfg.kind == "PLIF":
        k_ref, s_ref, v_ref = refs
        k = k_ref[...]
    else:
        (s_ref, v_ref), k = refs, None
    io = Lanes(m, x_ref.shape[1], masked)
    sdt = v0_ref.dtype

    def step(t, v):
        h = F.charge(cfg, v, io.load(x_ref, t).astype(sdt), None, k=k)
        s = (h >= cfg.v_threshold).astype(sdt)
        v = F.reset(cfg, h, s)
        io.store(s_ref, s.astype(s_ref.dtype), t)
        if return_v_seq:
            io.store(v_ref, v, t)
        return v

    v = jax.lax.fori_loop(0, T, step, io.load(v0_ref))
    if not return_v_seq:
        io.store(v_ref, v)


def forward(cfg: F.NeuronConfig, return_v_seq: bool, opts: KernelOptions, x, v0, k):
    """``(spikes [T, M] in x.dtype, V [T, M] or [M] in v0.dtype)`` from ``x [T, M]``, ``v0 [M]``.

    ``k``: PLIF's ``1/tau`` broadcast to a ``[bm]`` row of v0's dtype (so the kernel needs
    no scalar memory space), None otherwise.
    """
    T, M = x.shape
    bm = opts.block(M, backward=False)
    row = pl.BlockSpec((T, bm), lambda i: (0, i))
    lane = pl.BlockSpec((bm,), lambda i: (i,))
    in_specs = [row, lane] + ([pl.BlockSpec((bm,), lambda i: (0,))] if k is not None else [])
    v_shape = (T, M) if return_v_seq else (M,)
    xb, sb = x.dtype.itemsize, v0.dtype.itemsize
    return pl.pallas_call(
        functools.partial(_kernel, cfg, T, return_v_seq, M, opts.masked_rows()),
        out_shape=(jax.ShapeDtypeStruct((T, M), x.dtype), jax.ShapeDtypeStruct(v_shape, v0.dtype)),
        grid=(pl.cdiv(M, bm),),
        in_specs=in_specs,
        out_specs=(row, row if return_v_seq else lane),
        interpret=opts.use_interpret(),
        compiler_params=opts.compiler_params(),
        cost_estimate=pl.CostEstimate(flops=8 * T * M, transcendentals=0,
                                      bytes_accessed=T * M * (2 * xb + (sb if return_v_seq else 0)) + 2 * M * sb),
        name=f"snn_{cfg.kind.lower()}_forward",
    )(x, v0, *([k] if k is not None else []))

