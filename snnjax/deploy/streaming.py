"""Streaming inference: one time step in, logits out, the neuron states carried between calls.

    stream = Streamer(model)          # a model in eval mode whose forward is an op chain
    for frame in frames:              # frame [N, ...]: one time step of N streams
        logits = stream(frame)        # [N, num_classes]
    stream.reset()                    # forget the states (a new sequence)

The step is one jitted function ``(model state, states, x) -> (logits, states)`` compiled once per
input shape; over ``T`` steps it gives the multi-step forward's logits ``[T, N, K]`` step by step
(the same spikes; logits equal to rounding). Stateless layers run on ``[N, ...]`` per step
instead of the merged ``[T*N, ...]`` batch.
"""
from __future__ import annotations

import jax
from flax import nnx

from snnjax.deploy.graph import layer_ops
from snnjax.deploy.ops import initial_states, neuron_ops, step_ops


def _step(graphdef: nnx.GraphDef, model_state: nnx.State, states: list[jax.Array], x: jax.Array):
    model = nnx.merge(graphdef, model_state)
    return step_ops(layer_ops(model), x, states)


_jitted_step = jax.jit(_step, static_argnums=0)


class Streamer:
    """Stateful single-step inference over ``model`` (``SpikingMLP``, ``CIFAR10DVSVGG``, a ``Sequential`` of ops).

    Call it with one time step ``x [N, ...]`` (the model's input without ``T``) to get logits ``[N, K]``;
    the neuron states persist until :meth:`reset`. ``states`` holds them (one array per neuron layer,
    in forward order), ``None`` before the first step. The model is put in eval mode.
    """

    def __init__(self, model: nnx.Module):
        model.eval()
        self.ops = layer_ops(model)
        self.neuron_names = [op.name for op in neuron_ops(self.ops)]
        self._graphdef, self._model_state = nnx.split(model)
        self.states: list[jax.Array] | None = None

    def reset(self) -> None:
        """Forget the neuron states: the next step starts a new sequence from the fresh state (``v_reset``)."""
        self.states = None

    def init_states(self, x: jax.Array) -> list[jax.Array]:
        """Fresh neuron states for steps shaped like ``x [N, ...]``."""
        return initial_states(self.ops, jax.ShapeDtypeStruct(x.shape, x.dtype))

    def step(self, x: jax.Array, states: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        """The pure step: ``(logits [N, K], new states)`` from ``states``."""
        return _jitted_step(self._graphdef, self._model_state, states, x)

    def __call__(self, x: jax.Array) -> jax.Array:
        """One time step ``x [N, ...]`` -> logits ``[N, K]``, carrying the neuron states."""
        if self.states is None:
            self.states = self.init_states(x)
        logits, self.states = self.step(x, self.states)
        return logits
