"""Streaming inference: one time step in, logits out, the neuron states carried between calls.

    stream = Streamer(model)          # a model in eval mode
    for frame in frames:              # frame [N, ...]: one time step of N streams
        logits = stream(frame)        # [N, num_classes]
    stream.reset()                    # forget the states (a new sequence)

A step is the model's own forward on a sequence of one time step (``x[None]``), every spiking neuron
switched to single-step mode (SpikingJelly's ``step_mode="s"``) from the carried state: ``step(model, x,
states)`` is the pure function, ``Streamer`` jits it once per input shape. Over ``T`` steps it gives the
multi-step forward's logits ``[T, N, K]`` step by step (the same spikes; logits equal to rounding) for any
model whose layers act on each time step on its own (convolutions, BatchNorm in eval mode, pooling, attention
over tokens, residuals: the zoo) and whose neurons are each called once per step; a neuron called twice per
step, or a model without neurons or without the time axis in its output, is refused with
``UnsupportedModelError``.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.deploy.calls import UnsupportedModelError, neurons
from snnjax.neurons.modules import observe


def step(model: nnx.Module, x: jax.Array, states: Sequence[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    """One time step ``x [N, ...]`` through ``model`` from ``states`` (one ``[N, ...]`` per state variable of each
    neuron of ``neurons(model)``, in that order: ``state_slots``; anything broadcastable to it): ``(output [N, ...],
    new states)``.

    The model's neurons are in single-step mode during the call and restored afterwards.

    Raises:
      UnsupportedModelError: a neuron not called exactly once (see the module docstring).
    """
    named = neurons(model)
    slots = state_slots(named)
    if len(states) != len(slots):
        raise ValueError(f"states: {len(states)} arrays for the {len(slots)} state variables of the {len(named)} "
                         f"neurons of {type(model).__name__}")
    modes = [node.step_mode for _, node in named]
    saved = [getattr(node, name).get_value() for node, name in slots]
    called = []
    try:
        for _, node in named:
            node.step_mode = "s"
        for (node, name), v in zip(slots, states, strict=True):
            getattr(node, name).set_value(jnp.asarray(v)[None])
        with observe(lambda node, *_: called.append(node)):
            y = model(x[None])
        new = [getattr(node, name).get_value()[0] for node, name in slots]
    finally:
        for (_, node), mode in zip(named, modes, strict=True):
            node.step_mode = mode
        for (node, name), v in zip(slots, saved, strict=True):
            getattr(node, name).set_value(v)
    _check_called_once(model, named, called)
    return y[0], new


def state_slots(named: list) -> list[tuple[nnx.Module, str]]:
    """``(neuron, state variable name)`` for every state variable of the neurons ``named`` (``neurons(model)``):
    ``v`` for most, more for neurons such as ``CUBALIFNode`` (``v``, ``c``)."""
    return [(node, name) for _, node in named for name in node.initial_state()]


def _check_called_once(model: nnx.Module, named: list, called: list) -> None:
    for name, node in named:
        count = sum(c is node for c in called)
        if count != 1:
            raise UnsupportedModelError(
                f"{type(model).__name__}'s neuron {name} is called {count} times per time step: streaming and "
                "single-step export carry one state per neuron, so each must be called once per step")


def initial_states(model: nnx.Module, frame: jax.ShapeDtypeStruct) -> list[jax.Array]:
    """Fresh neuron states (each neuron's ``initial_state()``: ``v_reset``, or 0 for a soft reset, for most) for
    steps ``frame [N, ...]``, one array per state variable (``state_slots``).

    Raises:
      UnsupportedModelError: ``model`` has no spiking neuron, its output has no time axis, or ``step`` refuses it.
    """
    named = _neurons_to_carry(model)
    graphdef, model_state = nnx.split(model)  # merged inside the traces: a module shared by two paths stays one
    t = frame.shape[0] + 1  # a length no other axis has

    def multi_step(s, x):
        m = nnx.merge(graphdef, s)
        called = []
        with observe(lambda node, *_: called.append(node)):
            y = m(x)
        _check_called_once(m, neurons(m), called)
        return y

    out = jax.eval_shape(multi_step, model_state, jax.ShapeDtypeStruct((t, *frame.shape), frame.dtype))
    if out.shape[:1] != (t,):
        raise UnsupportedModelError(f"{type(model).__name__} maps [T={t}, ...] inputs to {out.shape}: its output "
                                    "has no time axis, so one step's output is not one step of it")
    fresh = [node.initial_state()[name] for node, name in state_slots(named)]
    shapes = jax.eval_shape(lambda s, x: step(nnx.merge(graphdef, s), x, fresh)[1], model_state, frame)
    return [jnp.full(s.shape, v, s.dtype) for s, v in zip(shapes, fresh, strict=True)]


def _neurons_to_carry(model: nnx.Module) -> list:
    named = neurons(model)
    if not named:
        raise UnsupportedModelError(f"{type(model).__name__} has no spiking neuron (snnjax.neurons): there is no "
                                    "state to carry from one time step to the next")
    return named


def _step(graphdef: nnx.GraphDef, model_state: nnx.State, states: list[jax.Array], x: jax.Array):
    return step(nnx.merge(graphdef, model_state), x, states)


_jitted_step = jax.jit(_step, static_argnums=0)


class Streamer:
    """Stateful single-step inference over ``model`` (see the module docstring).

    Call it with one time step ``x [N, ...]`` (the model's input without ``T``) to get logits ``[N, K]``;
    the neuron states persist until :meth:`reset`. ``states`` holds them (one array per neuron, in the order
    of ``neuron_names``), ``None`` before the first step. The model is put in eval mode.
    """

    def __init__(self, model: nnx.Module):
        model.eval()
        self.neuron_names = [name for name, _ in _neurons_to_carry(model)]
        self._model = model
        self._graphdef, self._model_state = nnx.split(model)
        self.states: list[jax.Array] | None = None

    def reset(self) -> None:
        """Forget the neuron states: the next step starts a new sequence from the fresh state (``v_reset``)."""
        self.states = None

    def init_states(self, x: jax.Array) -> list[jax.Array]:
        """Fresh neuron states for steps shaped like ``x [N, ...]``."""
        return initial_states(self._model, jax.ShapeDtypeStruct(x.shape, x.dtype))

    def step(self, x: jax.Array, states: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        """The pure step: ``(logits [N, K], new states)`` from ``states``."""
        return _jitted_step(self._graphdef, self._model_state, states, x)

    def __call__(self, x: jax.Array) -> jax.Array:
        """One time step ``x [N, ...]`` -> logits ``[N, K]``, carrying the neuron states."""
        if self.states is None:
            self.states = self.init_states(x)
        logits, self.states = self.step(x, self.states)
        return logits
