"""Fused multi-timestep backward kernel: recompute H from X, then the reverse recurrence.

One program per block of ``bm`` neurons. A first loop over t = 0..T-1 re-runs the
forward from ``V_init`` and X (the forward kernel's ``charge``/``reset`` calls, so H and
the spikes are the forward's; bit for bit in interpret mode) and keeps the T rows of H
(for PLIF also ``dH_t/dk``, which needs X_t and V_{t-1}); a second loop over t = T-1..0
runs the reverse recurrence of the design notes (the XLA path's ``_bwd`` expressions),
writing dX row by row, and finally dV_init. Both loops are static (unrolled at trace
time), so the H rows are plain values: registers on a GPU (spilled to thread-local
memory when T x bm gets large), never global memory, and no scratch memory space is
needed. PLIF's ``dk`` is summed per lane over time and written as one ``[bm]`` row per
block; the sum over neurons happens outside (in XLA), so lanes past M (see ``lanes``)
never enter it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from snnjax.neurons import functional as F
from snnjax.pallas.lanes import Lanes
from snnjax.pallas.options import KernelOptions


def _kernel(cfg: F.NeuronConfig, T: int, return_v_seq: bool, m: int, masked: bool, x_ref, v0_ref, *refs):
    plif = cfg.kind == "PLIF"
    if plif:
        k_ref, ds_ref, dv_ref, dx_ref, dv0_ref, dk_ref = refs
        k = k_ref[...]
    else:
        (ds_ref, dv_ref, dx_ref, dv0_ref), k = refs, None
    io = Lanes(m, x_ref.shape[1], masked)
    v = io.load(v0_ref)
    sdt = v.dtype
    hs, dh_dk = [], []
    for t in range(T):  # recompute H (and PLIF's dH/dk) forward in time
        x = io.load(x_ref, t).astype(sdt)
        h = F.charge(cfg, v, x, None, k=k)
        if plif:
            dh_dk.append(x - (v - cfg.vr) if cfg.decay_input else -(v - cfg.vr))
        v = F.reset(cfg, h, (h >= cfg.v_threshold).astype(sdt))
        hs.append(h)

    if cfg.kind == "IF":
        carry_factor = 1.0
    else:
        carry_factor = 1.0 - (1.0 / cfg.tau if cfg.kind == "LIF" else k)  # dH_{t+1}/dV_t
    dv = jnp.zeros_like(v) if return_v_seq else io.load(dv_ref)
    dk = jnp.zeros_like(v)
    for t in reversed(range(T)):
        if return_v_seq:
            dv = dv + io.load(dv_ref, t)
        h = hs[t]
        g = cfg.surrogate.grad(h - cfg.v_threshold)
        s = (h >= cfg.v_threshold).astype(sdt)
        dh = io.load(ds_ref, t).astype(sdt) * g + dv * F.dv_dh(cfg, h, s, g)
        if plif:
            dk = dk + dh * dh_dk[t]
        io.store(dx_ref, F.dx_from_dh(cfg, dh, k).astype(dx_ref.dtype), t)
        dv = dh * carry_factor
    io.store(dv0_ref, dv)
    if plif:
        io.store(dk_ref, dk)


def backward(cfg: F.NeuronConfig, return_v_seq: bool, opts: KernelOptions, x, v0, k, ds, dv):
    """``(dx [T, M] in x.dtype, dv0 [M], dk [M] per-neuron partials or None)``.

    ``ds [T, M]`` is the spikes' cotangent, ``dv`` the state's (``[T, M]`` with
    ``return_v_seq``, else ``[M]``); ``k`` as in ``forward``. Sum ``dk`` for PLIF's dL/dk.
    """
    T, M = x.shape
    bm = opts.block(M, backward=True)
    row = pl.BlockSpec((T, bm), lambda i: (0, i))
    lane = pl.BlockSpec((bm,), lambda i: (i,))
    plif = k is not None
    in_specs = [row, lane] + ([pl.BlockSpec((bm,), lambda i: (0,))] if plif else []) + [
        row, row if return_v_seq else lane]
    sdt = v0.dtype
    out_shape = [jax.ShapeDtypeStruct((T, M), x.dtype), jax.ShapeDtypeStruct((M,), sdt)]
    out_specs = [row, lane]
    if plif:
        out_shape.append(jax.ShapeDtypeStruct((M,), sdt))
        out_specs.append(lane)
    xb, sb = x.dtype.itemsize, sdt.itemsize
    outs = pl.pallas_call(
        functools.partial(_kernel, cfg, T, return_v_seq, M, opts.masked_rows()),
        out_shape=tuple(out_shape),
        grid=(pl.cdiv(M, bm),),
        in_specs=in_specs,
        out_specs=tuple(out_specs),
        interpret=opts.use_interpret(),
        compiler_params=opts.compiler_params(),
        cost_estimate=pl.CostEstimate(flops=25 * T * M, transcendentals=T * M,
                                      bytes_accessed=T * M * (3 * xb + (sb if return_v_seq else 0)) + 4 * M * sb),
        name=f"snn_{cfg.kind.lower()}_backward",
    )(x, v0, *([k] if plif else []), ds, dv)
    return outs[0], outs[1], (outs[2] if plif else None)
