"""``multistep`` through the fused Pallas kernels, with a ``custom_vjp`` around them.

Same contract as ``snnjax.neurons.multistep`` (which dispatches here for
``impl="pallas"``, and for ``impl="auto"`` on GPU): ``x_seq [T, ...]`` with any trailing
shape is flattened to ``[T, M]``; gradients flow to ``x_seq``, ``v_init`` and PLIF's ``w``.

What is stored between forward and backward, for every variant (IF / LIF / PLIF,
hard / soft reset, detach or not, any surrogate whose forward is the step ``1[x >= 0]``, its
derivative ``grad`` traced into the backward kernel): X itself (``[T, M]`` in the input
dtype), V_init, V at the start of every later chunk of ``K = options.time_chunk`` steps
(``[ceil(T/K) - 1, M]``) and ``w``; the backward recomputes H (and for PLIF V_{t-1})
chunk by chunk from them. Bytes moved per neuron-step, with b the input's
itemsize (4 float32, 2 bfloat16)::

    forward   read X, write S                        2b
    backward  read X, read dS, write dX              3b      total 5b: 20 B fp32, 10 B bf16
    return_v_seq adds a V write and a dV read in the state dtype (at least 4 B each)

plus under 8/K bytes for the checkpoints (written once, read once) and O(1/T) per-neuron
terms: V_T written, PLIF's dk partial written, and only where given, V_init read (twice)
and dV_init written, and dV_T read. Without ``v_init`` every neuron starts from one value
(a scalar, read from cache), and a zero cotangent of V_T arrives symbolic: at T = 4 these
were a third of the minimum traffic. Storing H
instead would cost 24 B fp32 / 16 B bf16 (write H in the forward, read it instead of X
in the backward, H being in the float32 state dtype), and hold an fp32 residual where X
may be bf16; no variant needs it: PLIF's ``dH/dk = X - (V_{t-1} - v_r)`` (or
``-(V_{t-1} - v_r)``) comes from the same recomputation. Chunking bounds what the
backward keeps live per neuron (K values of H, not T), so long sequences do not spill
registers.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from snnjax.neurons import base as B
from snnjax.neurons.kernels.pallas import step
from snnjax.neurons.kernels.pallas.backward import backward
from snnjax.neurons.kernels.pallas.forward import forward
from snnjax.neurons.kernels.pallas.options import DEFAULT, KernelOptions

# Off the CPU (interpret mode) the kernels are compiled for the GPU, where float64 is
# not offered by this package (Triton's float64 is untested here): those use impl="xla".
GPU_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def unsupported_reason(cfg: B.NeuronConfig | B.StepNeuron, shape, dtype, opts: KernelOptions = DEFAULT) -> str | None:
    """Why the Pallas path cannot run this neuron on inputs of ``shape``/``dtype`` (None if it can)."""
    if isinstance(cfg, B.StepNeuron):
        reason = step.unsupported_reason(cfg, shape, dtype)
        if reason is not None:
            return reason
    elif not cfg.surrogate.heaviside:  # every IF / LIF / PLIF variant, and any surrogate whose forward is the step
        return (f"surrogate {cfg.surrogate!r} does not fire the 0/1 step 1[x >= 0] (spiking=False, or a spike "
                "count) that the kernels compute")
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        return f"inputs must be floating point, got {dtype}"
    if len(shape) < 1 or 0 in shape:
        return f"inputs must be a non-empty [T, ...] sequence, got shape {tuple(shape)}"
    if opts.use_interpret():
        return None
    if not any(dtype == jnp.dtype(d) for d in GPU_DTYPES):
        return (f"{dtype} inputs run only in interpret mode (CPU); the compiled kernels take "
                f"{', '.join(jnp.dtype(d).name for d in GPU_DTYPES)}")
    return None


def multistep(cfg: B.NeuronConfig | B.StepNeuron, x_seq: jax.Array, v_init=None, w=None, *,
              return_v_seq: bool = False, options: KernelOptions = DEFAULT):
    """``(spikes [T, ...], v)`` as ``snnjax.neurons.multistep``, computed by the fused kernels: the hand-written
    ones for IF / LIF / PLIF, the step's own (``step.multistep``; ``w`` its params pytree) for a ``StepNeuron``.

    Raises ValueError (see ``unsupported_reason``) where the kernels cannot run.
    """
    x_seq = jnp.asarray(x_seq)
    reason = unsupported_reason(cfg, x_seq.shape, x_seq.dtype, options)
    if reason is not None:
        other = "scan" if isinstance(cfg, B.StepNeuron) else "xla"
        raise ValueError(f"the Pallas neuron kernels cannot run this call: {reason}; use impl={other!r}")
    if isinstance(cfg, B.StepNeuron):
        return step.multistep(cfg, x_seq, v_init, w, return_v_seq=return_v_seq, options=options)
    B.check_decay_param(cfg, w)
    if v_init is None:  # one start for every neuron: no [M] array read, no dV_init written
        v0 = jnp.full((), cfg.vr, B.state_dtype(x_seq.dtype))
    else:
        v0 = B.broadcast_state(cfg, x_seq, v_init).reshape(-1)
    T, trailing = x_seq.shape[0], x_seq.shape[1:]
    s, v = _fused(cfg, return_v_seq, options, x_seq.reshape(T, -1), v0, w)
    return s.reshape(x_seq.shape), v.reshape(x_seq.shape if return_v_seq else trailing)


def _decay_row(cfg, opts, w, m, sdt, backward):
    """PLIF's k = sigmoid(w) in the state dtype (rounded as ``base.charge`` does), as one block-wide row."""
    if cfg.kind != "PLIF":
        return None
    k = jax.nn.sigmoid(jnp.asarray(w).reshape(())).astype(sdt)
    return jnp.full((opts.block(m, backward),), k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _fused(cfg, return_v_seq, opts, x, v0, w):
    k_row = _decay_row(cfg, opts, w, x.shape[1], v0.dtype, False)
    return forward(cfg, return_v_seq, opts, x, v0, k_row, checkpoints=False)[:2]


def _fused_fwd(cfg, return_v_seq, opts, x, v0, w):
    # symbolic_zeros=True wraps each array argument in a CustomVJPPrimal (None stays None).
    x, v0, w = (p.value if isinstance(p, CustomVJPPrimal) else p for p in (x, v0, w))
    k_row = _decay_row(cfg, opts, w, x.shape[1], v0.dtype, False)
    s, v, ck = forward(cfg, return_v_seq, opts, x, v0, k_row, checkpoints=True)
    return (s, v), (x, ck, v0, w)


def _fused_bwd(cfg, return_v_seq, opts, res, cts):
    x, ck, v0, w = res
    ds, dv = cts
    # Zero cotangents arrive symbolic: an unused final V (the usual case) is not read.
    ds = jnp.zeros_like(x) if isinstance(ds, SymbolicZero) else ds
    dv = None if isinstance(dv, SymbolicZero) else dv.astype(v0.dtype)
    k_row = _decay_row(cfg, opts, w, x.shape[1], v0.dtype, True)
    dx, dv0, dk = backward(cfg, return_v_seq, opts, x, ck, v0, k_row, ds, dv)
    dv0 = jnp.zeros((), v0.dtype) if dv0 is None else dv0  # a shared start is a constant
    return dx, dv0, (B.plif_dw(cfg, w, jnp.sum(dk)) if cfg.kind == "PLIF" else None)


_fused.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


def forward_rule(cfg: B.NeuronConfig | B.StepNeuron, return_v_seq: bool, x: jax.Array, v0, w,
                 options: KernelOptions = DEFAULT):
    """The fused forward on ``x [T, M]``, for callers that run it per shard.

    Returns ``((s [T, M], v [T, M] or [M]), saved)``: ``saved`` holds the residuals besides x, v0 and w,
    each ``[..., M]`` (the V checkpoints, if any). ``snnjax.neurons.kernels.sharded`` calls this and ``backward_rule``.
    A ``StepNeuron`` runs the step's kernels (``step.forward_rule``: ``v0`` and ``w`` tuples, three outputs).
    """
    if isinstance(cfg, B.StepNeuron):
        return step.forward_rule(cfg, return_v_seq, x, v0, w, options)
    outs, (_, ck, _, _) = _fused_fwd(cfg, return_v_seq, options, x, v0, w)
    return outs, (() if ck is None else (ck,))


def backward_rule(cfg: B.NeuronConfig | B.StepNeuron, return_v_seq: bool, x: jax.Array, saved: tuple, v0, w, ds,
                  dv, *d_last, options: KernelOptions = DEFAULT):
    """``(dx [T, M], dv0 (v0's shape), dw or None)`` of the fused backward; ``ds`` / ``dv`` None where zero
    (a ``StepNeuron``: ``step.backward_rule``, with the final states' cotangents ``d_last``)."""
    if isinstance(cfg, B.StepNeuron):
        return step.backward_rule(cfg, return_v_seq, x, saved, v0, w, ds, dv, *d_last, options=options)
    ds = SymbolicZero(jax.typeof(x)) if ds is None else ds
    dv = SymbolicZero(jax.typeof(x).update(shape=x.shape[int(not return_v_seq):])) if dv is None else dv
    return _fused_bwd(cfg, return_v_seq, options, (x, saved[0] if saved else None, v0, w), (ds, dv))
