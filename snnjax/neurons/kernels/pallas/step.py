"""Fused multi-step Pallas kernels for any neuron given by its single step: the step traced into the kernel.

``multistep(neuron, x_seq, v_init, params, *, return_v_seq, options)`` has the contract of ``scan.multistep`` for
a ``base.StepNeuron`` (``snnjax.neurons.kernels.pallas.multistep`` hands step neurons here). The kernels are those
of IF / LIF / PLIF (``forward`` / ``backward``) with the step in place of the hand-written equations: one program
per block of neurons, the time loop inside in chunks of ``K = options.time_chunk`` steps. The forward keeps the S
state variables in registers and writes the outputs (and V's sequence), and checkpoints the states at the start
of every chunk but the first (``[ceil(T/K) - 1, S, M]``); the backward, last chunk first, recomputes a chunk's
states from its checkpoint (the step's forward), then runs the step's VJP (``jax.vjp`` of the step, traced into
the kernel) backwards through the chunk, writing dX and summing each parameter's gradient per lane (summed over
the neurons outside). Parameters are scalars (one value for every neuron), each a ``[bm]`` row in its own dtype.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero
from jax.experimental import pallas as pl

from snnjax.neurons import base as B
from snnjax.neurons.kernels.pallas.forward import checkpoint_rows, chunks
from snnjax.neurons.kernels.pallas.lanes import Lanes
from snnjax.neurons.kernels.pallas.options import DEFAULT, KernelOptions


def unsupported_reason(neuron: B.StepNeuron, shape, dtype) -> str | None:
    """Why the step kernels cannot run ``neuron`` (None if they can): they take scalar parameters."""
    for leaf in jax.tree.leaves(neuron.params_like):
        if math.prod(leaf.shape) != 1:
            return (f"{neuron.name} has a parameter of shape {leaf.shape}; the Pallas kernels generated from a "
                    "step take scalar parameters")
    return None


def multistep(neuron: B.StepNeuron, x_seq: jax.Array, v_init=None, params=None, *, return_v_seq: bool = False,
              options: KernelOptions = DEFAULT):
    """``(outs [T, ...] in x's dtype, v)`` as ``scan.multistep``, computed by the step's Pallas kernels."""
    x_seq = jnp.asarray(x_seq)
    state0 = B.start_states(neuron, x_seq, v_init)
    T, trailing = x_seq.shape[0], x_seq.shape[1:]
    s0 = jnp.stack([state0[name].reshape(-1) for name in neuron.names])
    leaves = [jnp.asarray(a).reshape(()) for a in jax.tree.leaves(params)]
    out, v_seq, last = _fused(neuron, return_v_seq, options, x_seq.reshape(T, -1), s0, leaves)
    out = out.reshape(x_seq.shape)
    if return_v_seq:
        return out, v_seq.reshape(x_seq.shape)
    final = {name: last[i].reshape(trailing) for i, name in enumerate(neuron.names)}
    return out, (final["v"] if len(neuron.names) == 1 else final)


def _rows(leaves, bm: int) -> list[jax.Array]:
    return [jnp.full((bm,), a) for a in leaves]


def _per_neuron(kernel):
    """``kernel`` traced in ``base.per_neuron``'s context (no mesh), as the step acts on each neuron alone."""
    @functools.wraps(kernel)
    def traced(*args):
        with B.per_neuron():
            return kernel(*args)
    return traced


@_per_neuron
def _forward_kernel(step, S, P, T, K, return_v_seq, checkpoints, m, x_ref, s0_ref, *refs):
    prm = [r[...] for r in refs[:P]]
    out_ref, *refs = refs[P:]
    v_ref = refs.pop(0) if return_v_seq else None
    last_ref = refs.pop(0)
    ck_ref = refs.pop(0) if checkpoints else None
    io = Lanes(m, x_ref.shape[1])
    sdt = s0_ref.dtype

    def one(t, states):
        out, states = step(io.load(x_ref, t).astype(sdt), states, prm)
        io.store(out_ref, out.astype(out_ref.dtype), t)
        if return_v_seq:
            io.store(v_ref, states[0], t)
        return states

    def chunk(c, states, length, save):
        for j in range(length):
            states = one(c * K + j, states)
        if save:  # the start of chunk c + 1
            for k in range(S):
                io.store(ck_ref, states[k], c * S + k)
        return states

    n_full, rest = chunks(T, K)
    n_saved = n_full if rest else n_full - 1
    states = [io.load(s0_ref, k) for k in range(S)]
    states = jax.lax.fori_loop(0, n_saved, functools.partial(chunk, length=K, save=checkpoints), states)
    states = chunk(n_saved, states, rest or K, save=False)
    for k in range(S):
        io.store(last_ref, states[k], k)


@_per_neuron
def _backward_kernel(step, S, P, T, K, dv_in, m, x_ref, *refs):
    refs = list(refs)
    ck_ref = refs.pop(0) if checkpoint_rows(T, K) else None
    s0_ref = refs.pop(0)
    prm = [refs.pop(0)[...] for _ in range(P)]
    dout_ref, dlast_ref = refs.pop(0), refs.pop(0)
    dv_ref = refs.pop(0) if dv_in else None
    dx_ref, ds0_ref = refs.pop(0), refs.pop(0)
    dp_refs = refs[:P]
    io = Lanes(m, x_ref.shape[1])
    sdt = s0_ref.dtype

    def chunk(c, carry, length, states):
        d_states, d_prm = carry
        xs, befores = [], []
        for j in range(length):  # recompute the states before each step, forward in time
            x = io.load(x_ref, c * K + j).astype(sdt)
            befores.append(states)
            xs.append(x)
            _, states = step(x, states, prm)
        for j in reversed(range(length)):
            t = c * K + j
            if dv_in:
                d_states = [d_states[0] + io.load(dv_ref, t), *d_states[1:]]
            _, vjp = jax.vjp(step, xs[j], befores[j], prm)
            dx, d_states, dp = vjp((io.load(dout_ref, t).astype(sdt), d_states))
            d_prm = [a + b.astype(a.dtype) for a, b in zip(d_prm, dp, strict=True)]
            io.store(dx_ref, dx.astype(dx_ref.dtype), t)
        return d_states, d_prm

    n_full, rest = chunks(T, K)
    last = n_full if rest else n_full - 1

    def start(c):  # chunk c > 0 starts at checkpoint c - 1, chunk 0 at the start state
        return [io.load(ck_ref, (c - 1) * S + k) if c is not None else io.load(s0_ref, k) for k in range(S)]

    carry = ([io.load(dlast_ref, k) for k in range(S)], [jnp.zeros(x_ref.shape[1:], p.dtype) for p in prm])
    carry = chunk(last, carry, rest or K, start(last) if last else start(None))
    if last > 1:
        carry = jax.lax.fori_loop(
            1, last, lambda i, cr: chunk(last - i, cr, K, start(last - i)), carry)
    if last:
        carry = chunk(0, carry, K, start(None))
    d_states, d_prm = carry
    for k in range(S):
        io.store(ds0_ref, d_states[k], k)
    for ref, d in zip(dp_refs, d_prm, strict=True):
        io.store(ref, d)


def _specs(T, bm, S, P):
    row = pl.BlockSpec((T, bm), lambda i: (0, i))
    states = pl.BlockSpec((S, bm), lambda i: (0, i))
    shared = pl.BlockSpec((bm,), lambda i: (0,))  # a parameter's row, the same for every program
    return row, states, shared


def forward(neuron, return_v_seq, opts, x, s0, leaves, checkpoints: bool):
    """``(out [T, M] in x.dtype, V [T, M] or None, last states [S, M], checkpoints [n, S, M]-as-[n S, M] or None)``."""
    step, _ = neuron.flat_step()
    T, M = x.shape
    S, P = s0.shape[0], len(leaves)
    bm = opts.block(M, backward=False)
    n_ck = checkpoint_rows(T, opts.time_chunk)
    checkpoints = checkpoints and n_ck > 0
    row, states, shared = _specs(T, bm, S, P)
    out_shape = [jax.ShapeDtypeStruct((T, M), x.dtype)]
    out_specs = [row]
    if return_v_seq:
        out_shape.append(jax.ShapeDtypeStruct((T, M), s0.dtype))
        out_specs.append(row)
    out_shape.append(jax.ShapeDtypeStruct((S, M), s0.dtype))
    out_specs.append(states)
    if checkpoints:
        out_shape.append(jax.ShapeDtypeStruct((n_ck * S, M), s0.dtype))
        out_specs.append(pl.BlockSpec((n_ck * S, bm), lambda i: (0, i)))
    outs = list(pl.pallas_call(
        functools.partial(_forward_kernel, step, S, P, T, opts.time_chunk, return_v_seq, checkpoints, M),
        out_shape=tuple(out_shape),
        grid=(pl.cdiv(M, bm),),
        in_specs=[row, states, *[shared] * P],
        out_specs=tuple(out_specs),
        interpret=opts.use_interpret(),
        compiler_params=opts.compiler_params(),
        name=f"snn_step_{neuron.name.lower()}_forward",
    )(x, s0, *_rows(leaves, bm)))
    out = outs.pop(0)
    v_seq = outs.pop(0) if return_v_seq else None
    last = outs.pop(0)
    return out, v_seq, last, (outs.pop(0) if checkpoints else None)


def backward(neuron, opts, x, ck, s0, leaves, d_out, d_v_seq, d_last):
    """``(dx [T, M] in x.dtype, ds0 [S, M], [dp [M] per-lane partials per parameter])``; ``d_v_seq`` None where
    V's sequence has no cotangent."""
    step, _ = neuron.flat_step()
    T, M = x.shape
    S, P = s0.shape[0], len(leaves)
    bm = opts.block(M, backward=True)
    row, states, shared = _specs(T, bm, S, P)
    lane = pl.BlockSpec((bm,), lambda i: (i,))
    operands, in_specs = [x], [row]
    if ck is not None:
        operands.append(ck)
        in_specs.append(pl.BlockSpec((ck.shape[0], bm), lambda i: (0, i)))
    operands += [s0, *_rows(leaves, bm), d_out, d_last]
    in_specs += [states, *[shared] * P, row, states]
    if d_v_seq is not None:
        operands.append(d_v_seq)
        in_specs.append(row)
    out_shape = [jax.ShapeDtypeStruct((T, M), x.dtype), jax.ShapeDtypeStruct((S, M), s0.dtype),
                 *[jax.ShapeDtypeStruct((M,), a.dtype) for a in leaves]]
    outs = pl.pallas_call(
        functools.partial(_backward_kernel, step, S, P, T, opts.time_chunk, d_v_seq is not None, M),
        out_shape=tuple(out_shape),
        grid=(pl.cdiv(M, bm),),
        in_specs=in_specs,
        out_specs=(row, states, *[lane] * P),
        interpret=opts.use_interpret(),
        compiler_params=opts.compiler_params(backward=True),
        name=f"snn_step_{neuron.name.lower()}_backward",
    )(*operands)
    return outs[0], outs[1], list(outs[2:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _fused(neuron, return_v_seq, opts, x, s0, leaves):
    return forward(neuron, return_v_seq, opts, x, s0, leaves, checkpoints=False)[:3]


def _fused_fwd(neuron, return_v_seq, opts, x, s0, leaves):
    x, s0, leaves = jax.tree.map(lambda p: p.value if isinstance(p, CustomVJPPrimal) else p, (x, s0, leaves),
                                 is_leaf=lambda p: isinstance(p, CustomVJPPrimal))
    out, v_seq, last, ck = forward(neuron, return_v_seq, opts, x, s0, leaves, checkpoints=True)
    return (out, v_seq, last), (x, ck, s0, leaves)


def _fused_bwd(neuron, return_v_seq, opts, res, cts):
    x, ck, s0, leaves = res
    d_out, d_v_seq, d_last = cts
    d_out = jnp.zeros(x.shape, s0.dtype) if isinstance(d_out, SymbolicZero) else d_out
    d_v_seq = None if d_v_seq is None or isinstance(d_v_seq, SymbolicZero) else d_v_seq.astype(s0.dtype)
    d_last = jnp.zeros_like(s0) if isinstance(d_last, SymbolicZero) else d_last.astype(s0.dtype)
    dx, ds0, dp = backward(neuron, opts, x, ck, s0, leaves, d_out, d_v_seq, d_last)
    return dx, ds0, [jnp.sum(d).astype(a.dtype) for d, a in zip(dp, leaves, strict=True)]


_fused.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


def forward_rule(neuron: B.StepNeuron, return_v_seq: bool, x: jax.Array, s0: tuple, prm: tuple,
                 options: KernelOptions = DEFAULT):
    """The step's fused forward on one block ``x [T, M]``, for callers that run it per shard
    (``snnjax.neurons.kernels.sharded``).

    ``s0``: the start state, one array per state variable in ``neuron.names`` order, each ``[M]`` or a scalar
    (broadcast over the block); ``prm``: the parameters' leaves, scalars. Returns ``((out [T, M], V [T, M] or
    None, final states: a tuple of S ``[M]``), saved)``, ``saved`` the state checkpoints (or nothing).
    """
    s0_arr = _start(neuron, x, s0)
    out, v_seq, last, ck = forward(neuron, return_v_seq, options, x, s0_arr, list(prm), checkpoints=True)
    return (out, v_seq, tuple(last)), (() if ck is None else (ck,))


def backward_rule(neuron: B.StepNeuron, return_v_seq: bool, x: jax.Array, saved: tuple, s0: tuple, prm: tuple,
                  d_out, d_v_seq, d_last, options: KernelOptions = DEFAULT):
    """``(dx [T, M], d_s0 (a tuple shaped as s0), d_prm (a tuple of scalars))`` of the step's fused backward;
    ``d_out`` / ``d_v_seq`` None where zero, ``d_last`` a tuple of S ``[M]`` (None where zero) or None."""
    s0_arr = _start(neuron, x, s0)
    sdt = s0_arr.dtype
    d_out = jnp.zeros(x.shape, sdt) if d_out is None else d_out
    d_v_seq = None if d_v_seq is None else d_v_seq.astype(sdt)
    d_last = tuple(d_last) if d_last is not None else (None,) * len(s0)
    d_last = jnp.stack([jnp.zeros(x.shape[1:], sdt) if d is None else d.astype(sdt) for d in d_last])
    dx, ds0, dp = backward(neuron, options, x, saved[0] if saved else None, s0_arr, list(prm), d_out, d_v_seq,
                           d_last)
    d_s0 = tuple(jnp.sum(ds0[i]) if jnp.ndim(a) == 0 else ds0[i] for i, a in enumerate(s0))
    return dx, d_s0, tuple(jnp.sum(d).astype(jnp.result_type(a)) for d, a in zip(dp, prm, strict=True))


def _start(neuron: B.StepNeuron, x, s0: tuple) -> jax.Array:
    """The start states as the kernels read them, ``[S, M]`` in the state dtype."""
    sdt = B.state_dtype(x.dtype)
    return jnp.stack([jnp.broadcast_to(jnp.asarray(a, sdt), x.shape[1:]) for a in s0])
