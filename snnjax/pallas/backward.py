"""Fused multi-timestep backward kernel: recompute H chunk by chunk, then the reverse recurrence.

One program per block of ``bm`` neurons. The T steps are taken in the forward's chunks
of ``K = options.time_chunk``, last chunk first. For each chunk, a forward sweep from the
chunk's checkpointed V (written by the forward kernel) re-reads X and recomputes the K
rows of H (the forward kernel's ``charge``/``reset`` calls, so H and the spikes are the
forward's; bit for bit in interpret mode), and for PLIF ``dH_t/dk``, which needs X_t and
V_{t-1}; a reverse sweep over the chunk then runs the reverse recurrence of the design
notes (the XLA path's ``_bwd`` expressions), writing dX row by row and carrying dV into
the previous chunk; dV_init is written at the end. The chunks' steps are unrolled, so
the K rows of H are plain values in registers, never memory, and no scratch memory space
is needed; X is still read once, and at most K values of H per neuron are live, whatever
T is. PLIF's ``dk`` is summed per lane over time and written as one ``[bm]`` row per
block; the sum over neurons happens outside (in XLA), so lanes past M (see ``lanes``)
never enter it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from snnjax.neurons import functional as F
from snnjax.pallas.forward import chunks
from snnjax.pallas.lanes import Lanes
from snnjax.pallas.options import KernelOptions


def _kernel(cfg: F.NeuronConfig, T: int, K: int, return_v_seq: bool, m: int, x_ref, ck_ref, *refs):
    plif = cfg.kind == "PLIF"
    if plif:
        k_ref, ds_ref, dv_ref, dx_ref, dv0_ref, dk_ref = refs
        k = k_ref[...]
    else:
        (ds_ref, dv_ref, dx_ref, dv0_ref), k = refs, None
    io = Lanes(m, x_ref.shape[1])
    sdt = ck_ref.dtype
    if cfg.kind == "IF":
        carry_factor = 1.0
    else:
        carry_factor = 1.0 - (1.0 / cfg.tau if cfg.kind == "LIF" else k)  # dH_{t+1}/dV_t

    def chunk(c, carry, length):
        dv, dk = carry
        v = io.load(ck_ref, c)
        hs, dh_dk = [], []
        for j in range(length):  # recompute H (and PLIF's dH/dk) forward in time
            x = io.load(x_ref, c * K + j).astype(sdt)
            h = F.charge(cfg, v, x, None, k=k)
            if plif:
                dh_dk.append(x - (v - cfg.vr) if cfg.decay_input else -(v - cfg.vr))
            v = F.reset(cfg, h, (h >= cfg.v_threshold).astype(sdt))
            hs.append(h)
        for j in reversed(range(length)):
            t = c * K + j
            if return_v_seq:
                dv = dv + io.load(dv_ref, t)
            h = hs[j]
            g = cfg.surrogate.grad(h - cfg.v_threshold)
            s = (h >= cfg.v_threshold).astype(sdt)
            dh = io.load(ds_ref, t).astype(sdt) * g + dv * F.dv_dh(cfg, h, s, g)
            if plif:
                dk = dk + dh * dh_dk[j]
            io.store(dx_ref, F.dx_from_dh(cfg, dh, k).astype(dx_ref.dtype), t)
            dv = dh * carry_factor
        return dv, dk

    n_full, rest = chunks(T, K)
    zeros = jnp.zeros(x_ref.shape[1:], sdt)
    carry = (zeros if return_v_seq else io.load(dv_ref), zeros)
    if rest:
        carry = chunk(n_full, carry, rest)
    carry = jax.lax.fori_loop(0, n_full, lambda i, cr: chunk(n_full - 1 - i, cr, K), carry)
    dv, dk = carry
    io.store(dv0_ref, dv)
    if plif:
        io.store(dk_ref, dk)


def backward(cfg: F.NeuronConfig, return_v_seq: bool, opts: KernelOptions, x, ck, k, ds, dv):
    """``(dx [T, M] in x.dtype, dv0 [M], dk [M] per-neuron partials or None)``.

    ``ck [ceil(T/K), M]`` are the forward's checkpoints; ``ds [T, M]`` is the spikes'
    cotangent, ``dv`` the state's (``[T, M]`` with ``return_v_seq``, else ``[M]``); ``k``
    as in ``forward``. Sum ``dk`` for PLIF's dL/dk.
    """
    T, M = x.shape
    bm = opts.block(M, backward=True)
    row = pl.BlockSpec((T, bm), lambda i: (0, i))
    lane = pl.BlockSpec((bm,), lambda i: (i,))
    plif = k is not None
    in_specs = [row, pl.BlockSpec((ck.shape[0], bm), lambda i: (0, i))]
    in_specs += ([pl.BlockSpec((bm,), lambda i: (0,))] if plif else []) + [row, row if return_v_seq else lane]
    sdt = ck.dtype
    out_shape = [jax.ShapeDtypeStruct((T, M), x.dtype), jax.ShapeDtypeStruct((M,), sdt)]
    out_specs = [row, lane]
    if plif:
        out_shape.append(jax.ShapeDtypeStruct((M,), sdt))
        out_specs.append(lane)
    xb, sb = x.dtype.itemsize, sdt.itemsize
    outs = pl.pallas_call(
        functools.partial(_kernel, cfg, T, opts.time_chunk, return_v_seq, M),
        out_shape=tuple(out_shape),
        grid=(pl.cdiv(M, bm),),
        in_specs=in_specs,
        out_specs=tuple(out_specs),
        interpret=opts.use_interpret(),
        compiler_params=opts.compiler_params(backward=True),
        cost_estimate=pl.CostEstimate(
            flops=25 * T * M, transcendentals=T * M,
            bytes_accessed=T * M * (3 * xb + (sb if return_v_seq else 0)) + (ck.shape[0] + 3) * M * sb),
        name=f"snn_{cfg.kind.lower()}_backward",
    )(x, ck, *([k] if plif else []), ds, dv)
    return outs[0], outs[1], (outs[2] if plif else None)
