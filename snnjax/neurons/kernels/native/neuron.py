"""Multi-step IF / LIF / PLIF on the CPU through the native fused kernels.

Same contract as ``snnjax.neurons.multistep`` (which dispatches here for
``impl="native"``, and for ``impl="auto"`` on a CPU): ``x_seq [T, ...]`` with any trailing
shape runs as ``[T, M]``; gradients flow to ``x_seq``, ``v_init`` and PLIF's ``w``. The
kernels compute in float64 for float64 inputs and in float32 otherwise (the state dtype of
float32, bfloat16 and float16 inputs); spikes and ``dX`` come back in the input dtype.
Spikes and V equal the XLA path's bit for bit (the kernels round as XLA:CPU does), with
one exception: a single step (T = 1) of LIF / PLIF without decay_input from a start state
broadcast over the trailing shape, where XLA rounds V (1 - 1/tau) before adding X (V one
ulp apart); ``impl="auto"`` keeps the XLA path for T = 1.

Bytes per neuron-step in float32: forward 8 (read X, write S), backward 12 (read X and
dS, write dX; H is recomputed chunk by chunk into a scratch that stays in cache), the
20 B minimum of the design notes. Nothing ``[T, M]``-sized is stored between them but X
itself. Without ``v_init`` the start state is a scalar (no ``[M]`` array is read, and no
``dV_init`` written); a zero cotangent of the final state is not read either.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from snnjax.neurons import base as B
from snnjax.neurons import surrogate as sg
from snnjax.neurons.kernels.native import build, step

_SURROGATE_IDS = {sg.Sigmoid: 0, sg.ATan: 1, sg.PiecewiseQuadratic: 2, sg.SoftSign: 3, sg.Rect: 4}
_KIND_IDS = {"IF": 0, "LIF": 1, "PLIF": 2}


def unsupported_reason(cfg: B.NeuronConfig | B.StepNeuron, shape, dtype) -> str | None:
    """Why the native kernels cannot run this neuron call (None if they can)."""
    if isinstance(cfg, B.StepNeuron):
        return step.unsupported_reason(cfg, shape, dtype)
    dtype = jnp.dtype(dtype)
    if type(cfg.surrogate) not in _SURROGATE_IDS or not cfg.surrogate.spiking:
        return (f"surrogate {cfg.surrogate!r} is not one the C++ kernels compute (those: "
                f"{', '.join(c.__name__ for c in _SURROGATE_IDS)}, with spiking=True)")
    if not jnp.issubdtype(dtype, jnp.floating):
        return f"inputs must be floating point, got {dtype}"
    if len(shape) < 1 or 0 in shape:
        return f"inputs must be a non-empty [T, ...] sequence, got shape {tuple(shape)}"
    return None


def multistep(cfg: B.NeuronConfig | B.StepNeuron, x_seq: jax.Array, v_init=None, w=None, *,
              return_v_seq: bool = False):
    """``(spikes [T, ...], v)`` as ``snnjax.neurons.multistep``, computed by the native kernels: the hand-written
    ones for IF / LIF / PLIF, the ones generated from the step for a ``StepNeuron`` (``step.multistep``; ``w`` its
    params pytree).

    Raises ValueError where they cannot run this call, NativeBuildError where they cannot
    be built.
    """
    if isinstance(cfg, B.StepNeuron):
        return step.multistep(cfg, x_seq, v_init, w, return_v_seq=return_v_seq)
    B.check_decay_param(cfg, w)
    x_seq = jnp.asarray(x_seq)
    reason = unsupported_reason(cfg, x_seq.shape, x_seq.dtype)
    if reason is not None:
        raise ValueError(f"the native neuron kernels cannot run this call: {reason}; use impl='xla'")
    build.load()
    kdt = B.state_dtype(x_seq.dtype)
    T, trailing = x_seq.shape[0], x_seq.shape[1:]
    if v_init is None:
        v0 = jnp.full((), cfg.vr, kdt)  # a scalar: one start for every neuron, no dV_init
    else:
        v0 = B.broadcast_state(cfg, x_seq, v_init).reshape(-1)
    s, v = _fused(cfg, return_v_seq, x_seq.reshape(T, -1).astype(kdt), v0, w)
    return s.astype(x_seq.dtype).reshape(x_seq.shape), v.reshape(x_seq.shape if return_v_seq else trailing)


def _attrs(cfg: B.NeuronConfig, return_v_seq: bool, t: int, m: int) -> dict:
    return dict(kind=np.int64(_KIND_IDS[cfg.kind]), charging=np.int64(_charging(cfg)), hard=cfg.v_reset is not None,
                detach=cfg.detach_reset, v_seq=return_v_seq, decay_input=cfg.decay_input,
                v_reset=np.float64(cfg.vr), v_th=np.float64(cfg.v_threshold), tau=np.float64(cfg.tau),
                alpha=np.float64(cfg.surrogate.alpha), chunk=np.int64(build.chunk_size(t, m)))


def _charging(cfg: B.NeuronConfig) -> int:
    """The kernels' charging mode (``Charging`` in neuron_kernels.h): the formula ``base.charge`` uses."""
    if cfg.kind == "IF":
        return 0
    if cfg.decay_input:
        return 1
    return 2 if cfg.vr == 0.0 else 3


def _k(cfg: B.NeuronConfig, w, kdt) -> jax.Array:
    """PLIF's k = sigmoid(w) rounded to the state dtype as ``base.charge`` does (unused otherwise)."""
    return jax.nn.sigmoid(jnp.asarray(w)).astype(kdt).reshape(()) if cfg.kind == "PLIF" else jnp.zeros((), kdt)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(cfg, return_v_seq, x, v0, w):
    return _forward(cfg, return_v_seq, x, v0, w)


def _forward(cfg, return_v_seq, x, v0, w):
    T, M = x.shape
    call = jax.ffi.ffi_call(build.TARGETS["forward"][x.dtype.name],
                            (jax.ShapeDtypeStruct((T, M), x.dtype),
                             jax.ShapeDtypeStruct((T, M) if return_v_seq else (M,), x.dtype)))
    return tuple(call(x, v0, _k(cfg, w, x.dtype), **_attrs(cfg, return_v_seq, T, M)))


def _fused_fwd(cfg, return_v_seq, x, v0, w):
    # symbolic_zeros=True wraps each array argument in a CustomVJPPrimal (None stays None).
    x, v0, w = (p.value if isinstance(p, CustomVJPPrimal) else p for p in (x, v0, w))
    return _forward(cfg, return_v_seq, x, v0, w), (x, v0, w)


def _fused_bwd(cfg, return_v_seq, res, cts):
    x, v0, w = res
    ds, dv = cts
    T, M = x.shape
    # Zero cotangents arrive symbolic: an unused final V (the usual case) costs no read.
    ds = jnp.zeros_like(x) if isinstance(ds, SymbolicZero) else ds
    dv = jnp.zeros((), x.dtype) if isinstance(dv, SymbolicZero) else dv.astype(x.dtype)  # scalar: zero
    attrs = _attrs(cfg, return_v_seq, T, M)
    chunks = -(-M // int(attrs["chunk"]))
    call = jax.ffi.ffi_call(build.TARGETS["backward"][x.dtype.name],
                            (jax.ShapeDtypeStruct((T, M), x.dtype), jax.ShapeDtypeStruct(v0.shape, x.dtype),
                             jax.ShapeDtypeStruct((chunks,), x.dtype)))
    dx, dv0, dk = call(x, v0, _k(cfg, w, x.dtype), ds.astype(x.dtype), dv,
                       surrogate=np.int64(_SURROGATE_IDS[type(cfg.surrogate)]), **attrs)
    return dx, dv0, (B.plif_dw(cfg, w, jnp.sum(dk)) if cfg.kind == "PLIF" else None)


_fused.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


def forward_rule(cfg: B.NeuronConfig | B.StepNeuron, return_v_seq: bool, x: jax.Array, v0, w):
    """The fused forward on ``x [T, M]`` (already in the state dtype), for callers that run it per shard.

    Returns ``((s [T, M], v [T, M] or [M]), saved)``: ``saved`` holds the residuals besides x, v0 and w,
    each ``[..., M]`` (none here). ``snnjax.neurons.kernels.sharded`` calls this and ``backward_rule``.
    A ``StepNeuron`` runs its generated kernel (``step.forward_rule``: ``v0`` and ``w`` tuples, three outputs).
    """
    if isinstance(cfg, B.StepNeuron):
        return step.forward_rule(cfg, return_v_seq, x, v0, w)
    build.load()
    return _forward(cfg, return_v_seq, x, v0, w), ()


def backward_rule(cfg: B.NeuronConfig | B.StepNeuron, return_v_seq: bool, x: jax.Array, saved: tuple, v0, w,
                  ds, dv, *d_last):
    """``(dx [T, M], dv0 (v0's shape), dw or None)`` of the fused backward; ``ds`` / ``dv`` None where zero
    (a ``StepNeuron``: ``step.backward_rule``, with the final states' cotangents ``d_last``)."""
    if isinstance(cfg, B.StepNeuron):
        return step.backward_rule(cfg, return_v_seq, x, saved, v0, w, ds, dv, *d_last)
    ds = SymbolicZero(jax.typeof(x)) if ds is None else ds
    dv = SymbolicZero(jax.typeof(x).update(shape=x.shape[int(not return_v_seq):])) if dv is None else dv
    return _fused_bwd(cfg, return_v_seq, (x, *saved, v0, w), (ds, dv))
