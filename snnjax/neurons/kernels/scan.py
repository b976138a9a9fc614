"""The ``scan`` implementation: any neuron's single step under ``lax.scan``, differentiated by plain autodiff.

It runs every neuron: the built-in IF / LIF / PLIF (a ``NeuronConfig``: ``base.step``, so this is
``base.multistep_reference``) and every neuron given by its single step (a ``base.StepNeuron``: the
catalogue's and any a user writes), on every backend; the SPMD partitioner shards it like any elementwise
operation over the trailing dims. The backward is JAX's transpose of the scan: it stores each step's
residuals (H, the spike, the surrogate's input) rather than recomputing them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from snnjax.neurons import base as B


def unsupported_reason(cfg, shape, dtype) -> str | None:
    """Always None: this path runs every neuron on every input."""
    del cfg, shape, dtype
    return None


def initial_state(neuron: B.StepNeuron, x_seq: jax.Array, v_init=None) -> dict[str, jax.Array]:
    """The start state ``{name: [...]}`` for ``x_seq [T, ...]`` in the state dtype: ``v_init`` (the membrane
    potential, or a dict of some or all state variables, anything broadcastable), the rest fresh."""
    sdt = B.state_dtype(x_seq.dtype)
    given = v_init if isinstance(v_init, dict) else ({} if v_init is None else {"v": v_init})
    names = [name for name, _ in neuron.fresh]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"v_init names state variables {unknown} that {neuron.name} does not have (it has {names})")
    return {name: jnp.broadcast_to(jnp.asarray(given.get(name, fresh), sdt), x_seq.shape[1:])
            for name, fresh in neuron.fresh}


def multistep(neuron: B.NeuronConfig | B.StepNeuron, x_seq: jax.Array, v_init=None, w=None, *,
              return_v_seq: bool = False):
    """``(outs [T, ...] in x's dtype, v)`` as ``snnjax.neurons.multistep``, through ``base.scan_steps``.

    For a ``StepNeuron``, ``w`` is its params pytree and ``v`` the membrane potential sequence ``[T, ...]``
    with ``return_v_seq``, else the final state: the membrane potential ``[...]`` for a neuron whose only state
    it is, else the dict of every state variable. Gradients flow to ``x_seq``, ``v_init`` and ``w``.
    """
    if isinstance(neuron, B.NeuronConfig):
        return B.multistep_reference(neuron, x_seq, v_init, w, return_v_seq=return_v_seq)
    state0 = initial_state(neuron, x_seq, v_init)
    sdt = B.state_dtype(x_seq.dtype)

    def step(x, state):
        out, state = neuron.step(x.astype(sdt), state, w)
        return out.astype(x_seq.dtype), state

    outs, v = B.scan_steps(step, x_seq, state0, return_v_seq=return_v_seq)
    if not return_v_seq and len(neuron.fresh) == 1:
        v = v["v"]
    return outs, v
