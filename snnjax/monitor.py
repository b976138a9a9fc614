"""Per-layer spikes, firing rates and membrane potentials from one forward pass, with no change to the model.

In the manner of SpikingJelly's ``monitor`` (hooks on every neuron), but functional: the model is run
once on ``x`` in a jitted copy (eval mode unless ``train=True``; the model itself is not changed), and
every spiking neuron reports through ``snnjax.neurons.modules.observe``.

    rates = snnjax.monitor.firing_rates(model, x)     # {"layers.2": 0.12, ...}: spikes per neuron per step
    counts = snnjax.monitor.spike_counts(model, x)    # {"layers.2": 1234, ...}
    rec = snnjax.monitor.record(model, x)             # {"layers.2": {"spikes": [T, N, ...], "v": [T, N, ...]}}

Neurons are named by their attribute path in the model (``features.3.neuron``); a neuron called
twice reports its last call.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.neurons.modules import BaseNode, observe

__all__ = ["firing_rates", "record", "spike_counts"]


def record(model: nnx.Module, x: jax.Array, *, train: bool = False) -> dict[str, dict[str, jax.Array]]:
    """Each neuron's ``spikes`` and membrane potential ``v`` (``[T, N, ...]``, multi-step) for input ``x``."""
    return _run(model, x, train, "record")


def firing_rates(model: nnx.Module, x: jax.Array, *, train: bool = False) -> dict[str, float]:
    """Each neuron's mean spikes per neuron per time step for input ``x`` (0 to 1)."""
    return {k: float(v) for k, v in _run(model, x, train, "rate").items()}


def spike_counts(model: nnx.Module, x: jax.Array, *, train: bool = False) -> dict[str, int]:
    """Each neuron's total number of spikes for input ``x``."""
    return {k: int(round(float(v))) for k, v in _run(model, x, train, "count").items()}


def _run(model, x, train, what):
    graphdef, state = nnx.split(model)
    out = _forward(graphdef, state, x, train, what)
    if not out:
        raise ValueError(f"{type(model).__name__} ran no spiking neuron (snnjax.neurons IFNode / LIFNode / "
                         "ParametricLIFNode) on this input")
    return out


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _forward(graphdef, state, x, train: bool, what: str):
    model = nnx.merge(graphdef, state)
    if not train:
        model.eval()
    names = {id(m): ".".join(map(str, p)) for p, m in nnx.iter_modules(model) if isinstance(m, BaseNode)}
    out = {}

    def seen(neuron, spikes, v):
        spikes = spikes.astype(jnp.promote_types(spikes.dtype, jnp.float32))
        if what == "record":
            out[names[id(neuron)]] = {"spikes": spikes, "v": v}
        else:
            out[names[id(neuron)]] = jnp.mean(spikes) if what == "rate" else jnp.sum(spikes)

    with observe(seen):
        model(x)
    return out
