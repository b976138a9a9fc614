"""The ``assoc`` implementation: a linear recurrence without reset by ``jax.lax.associative_scan`` over time.

It runs a neuron that declares its step to be ``V_t = a V_{t-1} + b X_t`` with output ``V_t`` and no other state
(``base.StepNeuron.linear``; a ``BaseNode`` subclass declares it with ``linear_recurrence``: the catalogue's
``NonSpikingIFNode`` and ``NonSpikingLIFNode``). Step t is the affine map ``v -> a v + b X_t``; composing two
maps is ``(a1, c1) then (a2, c2) = (a1 a2, a2 c1 + c2)``, which is associative, so all T potentials come from a
parallel prefix over the maps (about ``2 log2 T`` elementwise levels instead of T sequential steps), the start
state folded into the first map. ``a`` and ``b`` come from ``linear(params)`` under plain autodiff, so the
gradients of learnable ones reach the params.

The backward (``custom_vjp``) is the reverse linear recurrence ``G_t = g_t + a G_{t+1}`` (``g_t`` the cotangent
of ``V_t``), itself an associative scan run from the end: ``dX_t = b G_t``, ``dV_0 = a G_0``,
``da = sum_t G_t V_{t-1}``, ``db = sum_t G_t X_t`` (summed to ``a``'s and ``b``'s shapes). It stores only the
input and the potentials. It took 0.6-0.96x the time of JAX's autodiff of the forward scan (which keeps every
level's intermediates) in 13 of 14 forward + backward timings (two one-off runs, 2-core CPU under a load of 7-13,
float32 ``[T, 64, C]``, T = 8..512 with C = 256, T = 8..128 with C = 4096; once 1.4x, at T = 128, C = 256).
Why ``auto`` does not pick this path: ``snnjax.neurons.kernels.dispatch.ASSOC_NOT_AUTO``.

The result equals the step's ``lax.scan`` (``kernels.scan``) where the math is exact, not bit for bit: the prefix
reassociates the sums (and the step's own operation order, e.g. ``V + (X - V) / tau``, becomes
``a V + b X``), so values differ by rounding (about 1e-15 relative in float64).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from snnjax.neurons import base as B


def unsupported_reason(neuron, shape, dtype) -> str | None:
    """Why this path cannot run ``neuron`` (None if it can): it needs a step that declares a linear recurrence
    (``StepNeuron.linear``) over the membrane potential alone."""
    del shape, dtype
    if isinstance(neuron, B.NeuronConfig):
        return f"{neuron.kind} fires and resets, so its recurrence is not linear"
    if neuron.linear is None:
        return (f"{neuron.name} declares no linear recurrence (a BaseNode declares V_t = a V_(t-1) + b X_t with "
                "linear_recurrence(params) -> (a, b), in the class that defines its step's hooks or below)")
    if neuron.names != ("v",):
        return f"{neuron.name} has the state variables {list(neuron.names)}; the assoc path runs V alone"
    return None


def coefficients(neuron: B.StepNeuron, params, trailing: tuple[int, ...], dtype) -> tuple[jax.Array, jax.Array]:
    """``(a, b)`` of ``neuron.linear(params)`` in ``dtype``, each with ``len(trailing)`` dims (leading ones added)
    so that it broadcasts against the state ``[*trailing]``; a ValueError names ``linear_recurrence`` where one
    does not broadcast."""
    out = []
    for name, c in zip("ab", neuron.linear(params), strict=True):
        c = jnp.asarray(c, dtype)
        if c.ndim > len(trailing) or any(n not in (1, m) for n, m in zip(c.shape[::-1], trailing[::-1], strict=False)):
            raise ValueError(f"{neuron.name}.linear_recurrence returns {name} of shape {c.shape}, which does not "
                             f"broadcast to the neurons' shape {tuple(trailing)}")
        out.append(c.reshape((1,) * (len(trailing) - c.ndim) + c.shape))
    return out[0], out[1]


def multistep(neuron: B.StepNeuron, x_seq: jax.Array, v_init=None, w=None, *, return_v_seq: bool = False):
    """``(outs [T, ...] in x's dtype, v)`` as ``snnjax.neurons.multistep``: ``outs`` the potentials ``V_t``, ``v``
    their sequence ``[T, ...]`` (state dtype) with ``return_v_seq``, else the final potential ``[...]``. ``w`` is
    the neuron's params pytree. Gradients flow to ``x_seq``, ``v_init`` and ``w`` (through ``a``, ``b``)."""
    reason = unsupported_reason(neuron, None, None)
    if reason is not None:
        raise ValueError(f"impl='assoc' cannot run this neuron: {reason}")
    sdt = B.state_dtype(x_seq.dtype)
    v0 = B.start_states(neuron, x_seq, v_init)["v"]
    a, b = coefficients(neuron, w, x_seq.shape[1:], sdt)
    v_seq = linear_scan(a, b, x_seq.astype(sdt), v0)
    return v_seq.astype(x_seq.dtype), (v_seq if return_v_seq else v_seq[-1])


def _compose(first, then):
    """The affine map ``first`` followed by ``then``, each ``(a, c)``: ``v -> a v + c``."""
    a1, c1 = first
    a2, c2 = then
    return a1 * a2, a2 * c1 + c2


def _prefix(a: jax.Array, c: jax.Array, *, reverse: bool = False) -> jax.Array:
    """``u_t = a u_{t-1} + c_t`` from ``u_{-1} = 0`` over ``c [T, ...]`` (``reverse``: ``u_t = a u_{t+1} + c_t``
    from the end), ``a`` a time-constant factor broadcastable to ``c[0]``."""
    maps = (jnp.broadcast_to(a, (c.shape[0], *a.shape)), c)
    return jax.lax.associative_scan(_compose, maps, reverse=reverse)[1]


@jax.custom_vjp
def linear_scan(a: jax.Array, b: jax.Array, x_seq: jax.Array, v0: jax.Array) -> jax.Array:
    """``V [T, ...]`` with ``V_t = a V_{t-1} + b X_t`` from ``V_{-1} = v0 [...]`` (one dtype; ``a``, ``b``
    broadcastable to ``v0``)."""
    return _forward(a, b, x_seq, v0)[0]


def _forward(a, b, x_seq, v0):
    c = b * x_seq
    c = c.at[0].add(a * v0)
    v_seq = _prefix(a, c)
    return v_seq, (a, b, x_seq, v0, v_seq)


def _sum_to(d: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``d`` summed over the dims that broadcasting ``shape`` to ``d``'s shape added (``shape`` has d's ndim)."""
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, d.shape, strict=True)) if n == 1 and m != 1)
    return jnp.sum(d, axis=axes, keepdims=True) if axes else d


def _backward(res, g):
    a, b, x_seq, v0, v_seq = res
    big = _prefix(a, g, reverse=True)  # dL/dV_t through every later step
    da = jnp.sum(big[1:] * v_seq[:-1], axis=0) + big[0] * v0
    db = jnp.sum(big * x_seq, axis=0)
    return _sum_to(da, a.shape), _sum_to(db, b.shape), b * big, a * big[0]


linear_scan.defvjp(_forward, _backward)
