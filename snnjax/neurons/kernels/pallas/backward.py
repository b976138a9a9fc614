"""Fused multi-timestep backward kernel: recompute H chunk by chunk, then the reverse recurrence.

One program per block of ``bm`` neurons. The T steps are taken in the forward's chunks
of ``K = options.time_chunk``, last chunk first. For each chunk, a forward sweep from its
start (V_init, or the V checkpointed by the forward kernel) re-reads X and recomputes the
K rows of H (the forward kernel's ``charge``/``reset`` calls, so H and the spikes are the
forward's; bit for bit in interpret mode), and for PLIF ``dH_t/dk``, which needs X_t and
V_{t-1}; a reverse sweep over the chunk then runs the reverse recurrence of the design
notes (the XLA path's ``_bwd`` expressions), writing dX row by row and carrying dV into
the previous chunk; dV_init is written at the end, unless the start was one value shared
by every neuron (the default state). A zero dV_T is not read. The chunks' steps are unrolled, so
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

from snnjax.neurons import base as B
from snnjax.neurons.kernels.pallas.forward import checkpoint_rows, chunks, start_row
from snnjax.neurons.kernels.pallas.lanes import Lanes
from snnjax.neurons.kernels.pallas.options import KernelOptions


def _kernel(cfg: B.NeuronConfig, T: int, K: int, return_v_seq: bool, dv_in: bool, dv0_out: bool, m: int, x_ref,
            *refs):
    plif = cfg.kind == "PLIF"
    refs = list(refs)
    ck_ref = refs.pop(0) if checkpoint_rows(T, K) else None
    v0_ref = refs.pop(0)
    k_ref = refs.pop(0) if plif else None
    ds_ref = refs.pop(0)
    dv_ref = refs.pop(0) if dv_in else None
    dx_ref = refs.pop(0)
    dv0_ref = refs.pop(0) if dv0_out else None
    dk_ref = refs.pop(0) if plif else None
    k = k_ref[...] if plif else None
    io = Lanes(m, x_ref.shape[1])
    sdt = v0_ref.dtype
    if cfg.kind == "IF":
        carry_factor = 1.0
    else:
        carry_factor = 1.0 - (1.0 / cfg.tau if cfg.kind == "LIF" else k)  # dH_{t+1}/dV_t

    def chunk(c, carry, length, v):
        dv, dk = carry
        hs, dh_dk = [], []
        for j in range(length):  # recompute H (and PLIF's dH/dk) forward in time
            x = io.load(x_ref, c * K + j).astype(sdt)
            h = B.charge(cfg, v, x, None, k=k)
            if plif:
                dh_dk.append(x - (v - cfg.vr) if cfg.decay_input else -(v - cfg.vr))
            v = B.reset(cfg, h, (h >= cfg.v_threshold).astype(sdt))
            hs.append(h)
        for j in reversed(range(length)):
            t = c * K + j
            if return_v_seq and dv_in:
                dv = dv + io.load(dv_ref, t)
            h = hs[j]
            g = cfg.surrogate.grad(h - cfg.v_threshold)
            s = (h >= cfg.v_threshold).astype(sdt)
            dh = io.load(ds_ref, t).astype(sdt) * g + dv * B.dv_dh(cfg, h, s, g)
            if plif:
                dk = dk + dh * dh_dk[j]
            io.store(dx_ref, B.dx_from_dh(cfg, dh, k).astype(dx_ref.dtype), t)
            dv = dh * carry_factor
        return dv, dk

    # Chunks last first: chunk c > 0 starts at checkpoint c - 1, chunk 0 at V_init.
    n_full, rest = chunks(T, K)
    last = n_full if rest else n_full - 1
    zeros = jnp.zeros(x_ref.shape[1:], sdt)
    carry = (io.load(dv_ref) if dv_in and not return_v_seq else zeros, zeros)
    carry = chunk(last, carry, rest or K, io.load(ck_ref, last - 1) if last else io.load(v0_ref))
    if last > 1:
        carry = jax.lax.fori_loop(
            1, last, lambda i, cr: chunk(last - i, cr, K, io.load(ck_ref, last - i - 1)), carry)
    if last:
        carry = chunk(0, carry, K, io.load(v0_ref))
    dv, dk = carry
    if dv0_out:
        io.store(dv0_ref, dv)
    if plif:
        io.store(dk_ref, dk)


def backward(cfg: B.NeuronConfig, return_v_seq: bool, opts: KernelOptions, x, ck, v0, k, ds, dv):
    """``(dx [T, M] in x.dtype, dv0 [M] or None, dk [M] per-neuron partials or None)``.

    ``ck``: the forward's checkpoints (None for T <= K); ``v0``: the start state, ``[M]``, or
    a scalar shared by every neuron (no dV_init is computed then: dv0 is None); ``ds [T, M]``
    is the spikes' cotangent, ``dv`` the state's (``[T, M]`` with ``return_v_seq``, else
    ``[M]``; None for a zero cotangent, which is then not read); ``k`` as in ``forward``.
    Sum ``dk`` for PLIF's dL/dk.
    """
    T, M = x.shape
    bm = opts.block(M, backward=True)
    row = pl.BlockSpec((T, bm), lambda i: (0, i))
    lane = pl.BlockSpec((bm,), lambda i: (i,))
    plif = k is not None
    dv0_out = v0.ndim > 0
    v0, v0_spec = start_row(v0, bm)
    operands, in_specs = [x], [row]
    if ck is not None:
        operands.append(ck)
        in_specs.append(pl.BlockSpec((ck.shape[0], bm), lambda i: (0, i)))
    operands.append(v0)
    in_specs.append(v0_spec)
    if plif:
        operands.append(k)
        in_specs.append(pl.BlockSpec((bm,), lambda i: (0,)))
    operands.append(ds)
    in_specs.append(row)
    if dv is not None:
        operands.append(dv)
        in_specs.append(row if return_v_seq else lane)
    sdt = v0.dtype
    out_shape = [jax.ShapeDtypeStruct((T, M), x.dtype)]
    out_specs = [row]
    for wanted in (dv0_out, plif):
        if wanted:
            out_shape.append(jax.ShapeDtypeStruct((M,), sdt))
            out_specs.append(lane)
    xb, sb = x.dtype.itemsize, sdt.itemsize
    n_ck = 0 if ck is None else ck.shape[0]
    outs = pl.pallas_call(
        functools.partial(_kernel, cfg, T, opts.time_chunk, return_v_seq, dv is not None, dv0_out, M),
        out_shape=tuple(out_shape),
        grid=(pl.cdiv(M, bm),),
        in_specs=in_specs,
        out_specs=tuple(out_specs),
        interpret=opts.use_interpret(),
        compiler_params=opts.compiler_params(backward=True),
        cost_estimate=pl.CostEstimate(
            flops=25 * T * M, transcendentals=T * M,
            bytes_accessed=T * M * (3 * xb + (sb if return_v_seq and dv is not None else 0))
            + (n_ck + 2 * dv0_out + (dv is not None and not return_v_seq) + plif) * M * sb),
        name=f"snn_{cfg.kind.lower()}_backward",
    )(*operands)
    outs = list(outs)
    dx = outs.pop(0)
    dv0 = outs.pop(0) if dv0_out else None
    return dx, dv0, (outs.pop(0) if plif else None)
