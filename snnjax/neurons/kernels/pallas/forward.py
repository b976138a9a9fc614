"""Fused multi-timestep forward kernel of IF / LIF / PLIF over time-major ``[T, M]`` data.

One program per block of ``bm`` neurons (a 1-D grid over M). It reads ``V_init`` once,
keeps V in registers through the T steps, and per step reads one row of X and writes
one row of spikes (and of V when the sequence is wanted). The steps run in chunks of
``K = options.time_chunk`` (a loop over chunks, each chunk unrolled); for the backward it
also writes V at the start of every chunk but the first, which starts at V_init
(``[ceil(T/K) - 1, M]`` checkpoints, ``4/K`` bytes per neuron-step, none for T <= K), from
which the backward recomputes one chunk of H at a time. The
charge and reset are the XLA path's own functions (``base.charge`` / ``reset``),
so the operation order, hence every spike, is the same. A partial last block is handled
by ``lanes.Lanes`` (masked rows).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from snnjax.neurons import base as B
from snnjax.neurons.kernels.pallas.lanes import Lanes
from snnjax.neurons.kernels.pallas.options import KernelOptions


def chunks(T: int, K: int) -> tuple[int, int]:
    """``(full chunks, steps in the last partial chunk)`` of T steps in chunks of K."""
    return T // K, T % K


def _kernel(cfg: B.NeuronConfig, T: int, K: int, return_v_seq: bool, checkpoints: bool, m: int,
            x_ref, v0_ref, *refs):
    if cfg.kind == "PLIF":
        k_ref, *refs = refs
        k = k_ref[...]
    else:
        k = None
    s_ref, v_ref, *ck_ref = refs
    io = Lanes(m, x_ref.shape[1])
    sdt = v0_ref.dtype

    def step(t, v):
        h = B.charge(cfg, v, io.load(x_ref, t).astype(sdt), None, k=k)
        s = (h >= cfg.v_threshold).astype(sdt)
        v = B.reset(cfg, h, s)
        io.store(s_ref, s.astype(s_ref.dtype), t)
        if return_v_seq:
            io.store(v_ref, v, t)
        return v

    def chunk(c, v, length, save):
        for j in range(length):
            v = step(c * K + j, v)
        if save:  # the start of chunk c + 1
            io.store(ck_ref[0], v, c)
        return v

    n_full, rest = chunks(T, K)
    n_saved = n_full if rest else n_full - 1  # every chunk but the last is followed by a checkpoint
    v = jax.lax.fori_loop(0, n_saved, functools.partial(chunk, length=K, save=checkpoints), io.load(v0_ref))
    v = chunk(n_saved, v, rest or K, save=False)
    if not return_v_seq:
        io.store(v_ref, v)


def checkpoint_rows(T: int, K: int) -> int:
    """Checkpointed chunk starts: every chunk's but the first (which starts at V_init)."""
    return -(-T // K) - 1


def start_row(v0, bm: int):
    """``(operand, BlockSpec)`` of a start state: ``[M]`` per neuron, or a scalar shared by all
    neurons as one ``[bm]`` row that every program reads (it stays in cache: no per-neuron bytes)."""
    if v0.ndim == 0:
        return jnp.full((bm,), v0), pl.BlockSpec((bm,), lambda i: (0,))
    return v0, pl.BlockSpec((bm,), lambda i: (i,))


def forward(cfg: B.NeuronConfig, return_v_seq: bool, opts: KernelOptions, x, v0, k, checkpoints: bool):
    """``(spikes [T, M] in x.dtype, V [T, M] or [M] in v0.dtype, checkpoints or None)``.

    ``x [T, M]``; ``v0 [M]``, or a scalar start shared by every neuron; ``k``: PLIF's
    ``1/tau`` broadcast to a ``[bm]`` row of v0's dtype (so the kernel needs no scalar
    memory space), None otherwise. With ``checkpoints``, the V before every chunk of
    ``opts.time_chunk`` steps but the first (``[checkpoint_rows, M]``; None when that is 0).
    """
    T, M = x.shape
    bm = opts.block(M, backward=False)
    n_ck = checkpoint_rows(T, opts.time_chunk)
    checkpoints = checkpoints and n_ck > 0
    row = pl.BlockSpec((T, bm), lambda i: (0, i))
    lane = pl.BlockSpec((bm,), lambda i: (i,))
    v0, v0_spec = start_row(v0, bm)
    in_specs = [row, v0_spec] + ([pl.BlockSpec((bm,), lambda i: (0,))] if k is not None else [])
    out_shape = [jax.ShapeDtypeStruct((T, M), x.dtype),
                 jax.ShapeDtypeStruct((T, M) if return_v_seq else (M,), v0.dtype)]
    out_specs = [row, row if return_v_seq else lane]
    if checkpoints:
        out_shape.append(jax.ShapeDtypeStruct((n_ck, M), v0.dtype))
        out_specs.append(pl.BlockSpec((n_ck, bm), lambda i: (0, i)))
    xb, sb = x.dtype.itemsize, v0.dtype.itemsize
    outs = pl.pallas_call(
        functools.partial(_kernel, cfg, T, opts.time_chunk, return_v_seq, checkpoints, M),
        out_shape=tuple(out_shape),
        grid=(pl.cdiv(M, bm),),
        in_specs=in_specs,
        out_specs=tuple(out_specs),
        interpret=opts.use_interpret(),
        compiler_params=opts.compiler_params(),
        cost_estimate=pl.CostEstimate(
            flops=8 * T * M, transcendentals=0,
            bytes_accessed=T * M * (2 * xb + (sb if return_v_seq else 0)) + (2 + checkpoints * n_ck) * M * sb),
        name=f"snn_{cfg.kind.lower()}_forward",
    )(x, v0, *([k] if k is not None else []))
    return outs[0], outs[1], (outs[2] if checkpoints else None)
