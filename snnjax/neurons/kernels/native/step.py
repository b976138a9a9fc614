"""Multi-step neurons given by their single step on the CPU, through the kernels ``codegen`` generates from the step.

``multistep(neuron, x_seq, v_init, params, *, return_v_seq)`` has the contract of ``scan.multistep`` for a
``base.StepNeuron`` (``snnjax.neurons.kernels.native.neuron.multistep`` hands step neurons here). The state
variables enter as one ``[S, M]`` array (``"v"`` first; ``v_init`` broadcast), or as ``[S]`` without ``v_init``
(the fresh state, the same for every neuron: nothing ``[M]``-sized read, no gradient written), the scalar
parameters as one ``[P]`` row; the backward (``custom_vjp``) recomputes the states from X and the start state,
so nothing ``[T, M]``-sized is stored but X. Gradients flow to ``x_seq``, ``v_init`` (every state variable) and
the params.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from snnjax.neurons import base as B
from snnjax.neurons.kernels.native import build, codegen


def unsupported_reason(neuron: B.StepNeuron, shape, dtype) -> str | None:
    """Why the generated kernels cannot run ``neuron`` on inputs of ``shape`` / ``dtype`` (None if they can)."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        return f"inputs must be floating point, got {dtype}"
    if len(shape) < 1 or 0 in shape:
        return f"inputs must be a non-empty [T, ...] sequence, got shape {tuple(shape)}"
    try:
        codegen.kernel(neuron, B.state_dtype(dtype))
    except codegen.Unsupported as e:
        return f"{neuron.name}'s step cannot be generated as a native kernel: {e}"
    return None


def multistep(neuron: B.StepNeuron, x_seq: jax.Array, v_init=None, params=None, *, return_v_seq: bool = False):
    """``(outs [T, ...] in x's dtype, v)`` as ``scan.multistep``, computed by the generated kernel.

    Raises ValueError (``codegen.Unsupported``) where the step cannot be generated, ``build.NativeBuildError``
    where it cannot be compiled.
    """
    x_seq = jnp.asarray(x_seq)
    sdt = B.state_dtype(x_seq.dtype)
    kernel = codegen.kernel(neuron, sdt)
    T, trailing = x_seq.shape[0], x_seq.shape[1:]
    if v_init is None:  # one start per state variable for every neuron: no [S, M] array read, no gradient
        s0 = jnp.asarray([fresh for _, fresh in neuron.fresh], sdt)
    else:
        state0 = B.start_states(neuron, x_seq, v_init)
        s0 = jnp.stack([state0[name].reshape(-1) for name in kernel.names])
    leaves = jax.tree.leaves(params)
    prm = jnp.stack([jnp.asarray(a).reshape(()) for a in leaves]) if leaves else jnp.zeros((0,), sdt)
    out, v_seq, last = _fused(kernel, return_v_seq, x_seq.reshape(T, -1).astype(sdt), s0, prm)
    out = out.astype(x_seq.dtype).reshape(x_seq.shape)
    if return_v_seq:
        return out, v_seq.reshape(x_seq.shape)
    final = {name: last[i].reshape(trailing) for i, name in enumerate(kernel.names)}
    return out, (final["v"] if len(kernel.names) == 1 else final)


def _attrs(kernel: codegen.Kernel, return_v_seq: bool, T: int, M: int) -> dict:
    chunk = build.chunk_size(T * len(kernel.names), M)
    return dict(key=np.int64(kernel.key), v_seq=return_v_seq, chunk=np.int64(chunk),
                scratch=np.int64(codegen.scratch_values(T, len(kernel.names), kernel.n_params, chunk)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(kernel, return_v_seq, x, s0, prm):
    return _forward(kernel, return_v_seq, x, s0, prm)


def _forward(kernel, return_v_seq, x, s0, prm):
    T, M = x.shape
    call = jax.ffi.ffi_call(build.TARGETS["step_forward"][x.dtype.name],
                            (jax.ShapeDtypeStruct((T, M), x.dtype),
                             jax.ShapeDtypeStruct((T, M) if return_v_seq else (1,), x.dtype),
                             jax.ShapeDtypeStruct((s0.shape[0], M), x.dtype)))
    return tuple(call(x, s0, prm, **_attrs(kernel, return_v_seq, T, M)))


def _fused_fwd(kernel, return_v_seq, x, s0, prm):
    # symbolic_zeros=True wraps each array argument in a CustomVJPPrimal.
    x, s0, prm = (p.value if isinstance(p, CustomVJPPrimal) else p for p in (x, s0, prm))
    return _forward(kernel, return_v_seq, x, s0, prm), (x, s0, prm)


def _fused_bwd(kernel, return_v_seq, res, cts):
    x, s0, prm = res
    T, M = x.shape
    d_out, d_v_seq, d_last = cts
    # Zero cotangents arrive symbolic: an unused output is not read (a [1] placeholder for V's sequence).
    d_out = jnp.zeros_like(x) if isinstance(d_out, SymbolicZero) else d_out
    if isinstance(d_v_seq, SymbolicZero) or not return_v_seq:
        d_v_seq = jnp.zeros((1,), x.dtype)
    d_last = jnp.zeros((s0.shape[0], M), x.dtype) if isinstance(d_last, SymbolicZero) else d_last
    attrs = _attrs(kernel, return_v_seq, T, M)
    chunks = -(-M // int(attrs["chunk"]))
    call = jax.ffi.ffi_call(build.TARGETS["step_backward"][x.dtype.name],
                            (jax.ShapeDtypeStruct((T, M), x.dtype), jax.ShapeDtypeStruct(s0.shape, x.dtype),
                             jax.ShapeDtypeStruct((chunks, prm.shape[0]), x.dtype)))
    dx, ds0, dp = call(x, s0, prm, d_out, d_v_seq, d_last, **attrs)
    return dx, ds0, jnp.sum(dp, axis=0)


_fused.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


def forward_rule(neuron: B.StepNeuron, return_v_seq: bool, x: jax.Array, s0: tuple, prm: tuple):
    """The generated forward on one block ``x [T, M]`` (already in the state dtype), for callers that run it per
    shard (``snnjax.neurons.kernels.sharded``).

    ``s0``: the start state, one array per state variable in ``neuron.names`` order, each ``[M]`` or a scalar (the
    fresh state, the same for every neuron); ``prm``: the parameters' leaves, scalars. Returns ``((out [T, M],
    V [T, M] or None, final states: a tuple of S ``[M]``), saved)``, ``saved`` the residuals besides x, s0 and prm
    (none: the backward recomputes the states).
    """
    kernel = codegen.kernel(neuron, x.dtype)
    out, v_seq, last = _forward(kernel, return_v_seq, x, *_operands(x, s0, prm))
    return (out, v_seq if return_v_seq else None, tuple(last)), ()


def backward_rule(neuron: B.StepNeuron, return_v_seq: bool, x: jax.Array, saved: tuple, s0: tuple, prm: tuple,
                  d_out, d_v_seq, d_last):
    """``(dx [T, M], d_s0 (a tuple shaped as s0), d_prm (a tuple of scalars in prm's dtypes))`` of the generated
    backward; ``d_out`` / ``d_v_seq`` None where zero, ``d_last`` a tuple of S ``[M]`` (None where zero) or None."""
    del saved
    kernel = codegen.kernel(neuron, x.dtype)
    s0_arr, prm_arr = _operands(x, s0, prm)
    d_out = SymbolicZero(jax.typeof(x)) if d_out is None else d_out
    d_v_seq = SymbolicZero(jax.typeof(x)) if d_v_seq is None else d_v_seq
    if d_last is None or all(d is None for d in d_last):
        d_last = SymbolicZero(jax.typeof(x).update(shape=(len(s0), x.shape[1])))
    else:
        d_last = jnp.stack([jnp.zeros(x.shape[1:], x.dtype) if d is None else d.astype(x.dtype) for d in d_last])
    dx, ds0, dp = _fused_bwd(kernel, return_v_seq, (x, s0_arr, prm_arr), (d_out, d_v_seq, d_last))
    return (dx, tuple(ds0[i] for i in range(len(s0))),
            tuple(dp[i].astype(jnp.result_type(p)) for i, p in enumerate(prm)))


def _operands(x, s0: tuple, prm: tuple):
    """The kernel's start state (``[S]`` for a fresh start, else ``[S, M]``) and parameter row ``[P]``."""
    if all(jnp.ndim(a) == 0 for a in s0):
        s0_arr = jnp.stack([jnp.asarray(a, x.dtype) for a in s0])
    else:
        s0_arr = jnp.stack([jnp.broadcast_to(jnp.asarray(a, x.dtype), x.shape[1:]) for a in s0])
    prm_arr = jnp.stack([jnp.asarray(a, x.dtype).reshape(()) for a in prm]) if prm else jnp.zeros((0,), x.dtype)
    return s0_arr, prm_arr
