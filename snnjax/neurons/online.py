"""Neurons for online training through time: ``OTTTLIFNode`` (OTTT, Xiao et al. 2022) and ``SLTTLIFNode`` (SLTT,
Meng et al. 2023), with SpikingJelly 2.0.0's class names, keywords and defaults.

Both are ``LIFNode``'s step (its charge, fire and reset) with the membrane potential cut from the graph before each
charge (SpikingJelly's training mode): a gradient never flows from one time step to the previous one, so a train
step can run forward and backward one time step at a time with activation memory that does not grow with ``T``
(``snnjax.train.step``, ``method="ottt"`` / ``"sltt"``). Forward values are LIF's exactly.

``OTTTLIFNode`` also keeps the presynaptic trace ``a = a (1 - 1/tau) + S`` (no gradient) as a second state
variable. Inside ``ottt_traces()`` a single-step call returns ``SpikeTrace(spike, trace)``, and a ``Sequential``
(or a model whose layers run through ``call_layer``, such as ``CIFAR10DVSVGG``) hands the pair on (SpikingJelly's
``OTTTSequential``): layers without parameters act on both, a layer with parameters outputs its value on the spikes
while its gradient is taken as if its input were the trace (``grad_with_trace``), so its weight gradient is ``dL/dy``
times the trace and its input gradient reaches the spikes. Outside the context (evaluation, streaming, multi-step
mode) the neurons return spikes only.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.neurons import base as B
from snnjax.neurons import surrogate as sg
from snnjax.neurons.modules import LIFNode

__all__ = ["OTTTLIFNode", "SLTTLIFNode", "SpikeTrace", "call_layer", "grad_with_trace", "ottt_traces"]

_TRACES: contextvars.ContextVar = contextvars.ContextVar("snnjax_ottt_traces", default=False)


@contextlib.contextmanager
def ottt_traces():
    """Within this context an ``OTTTLIFNode`` in single-step mode returns ``SpikeTrace(spike, trace)`` (the OTTT
    train step enters it while tracing)."""
    token = _TRACES.set(True)
    try:
        yield
    finally:
        _TRACES.reset(token)


class SpikeTrace(NamedTuple):
    """One time step's spikes and the presynaptic trace that stands in for them in weight gradients (``[N, ...]``
    each, or ``[1, N, ...]``)."""

    spike: jax.Array
    trace: jax.Array


class _OnlineLIF(LIFNode):
    """LIF whose state is cut from the graph before each charge (see the module docstring). Not the fused LIF kernels
    (their backward carries the state's gradient): the multi-step mode scans this step."""

    kind = None

    def neuronal_charge(self, x, v, params):
        state = v if isinstance(v, dict) else {"v": v}
        h = B.charge(self._lif_config(), jax.lax.stop_gradient(state["v"]), x, None)
        return {**state, "v": h} if isinstance(v, dict) else h

    def _lif_config(self) -> B.NeuronConfig:
        return B.NeuronConfig(kind="LIF", v_threshold=self.v_threshold, v_reset=self.v_reset,
                              detach_reset=self.detach_reset, surrogate=self.surrogate_function,
                              **self._config_kwargs())


class OTTTLIFNode(_OnlineLIF):
    """LIF for OTTT: state ``v`` (cut from the graph each step) and the presynaptic trace ``trace``; SpikingJelly's
    defaults (``decay_input=False``, soft reset, ``detach_reset=True``, ``step_mode="s"``)."""

    def __init__(self, tau: float = 2.0, decay_input: bool = False, v_threshold: float = 1.0,
                 v_reset: float | None = None, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = True, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        super().__init__(tau, decay_input, v_threshold, v_reset, surrogate_function, detach_reset, step_mode,
                         store_v_seq, impl)

    def initial_state(self):
        return {"v": 0.0 if self.v_reset is None else self.v_reset, "trace": 0.0}

    def neuronal_reset(self, h, spike, params):
        new = super().neuronal_reset(h, spike, params)
        trace = h["trace"] * (1.0 - 1.0 / self.tau) + spike
        return {**new, "trace": jax.lax.stop_gradient(trace)}

    def __call__(self, x: jax.Array):
        """Spikes for ``x``; ``SpikeTrace(spike, trace)`` in single-step mode inside ``ottt_traces()``."""
        spikes = super().__call__(x)
        if self.step_mode == "s" and _TRACES.get():
            return SpikeTrace(spikes, self.trace.get_value().astype(spikes.dtype))
        return spikes


class SLTTLIFNode(_OnlineLIF):
    """LIF for SLTT (spatial gradients only); SpikingJelly's defaults (``decay_input=True``, hard reset to 0,
    ``detach_reset=True``, ``step_mode="s"``)."""

    def __init__(self, tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, surrogate_function: sg.Surrogate = sg.Sigmoid(),
                 detach_reset: bool = True, step_mode: str = "s", store_v_seq: bool = False, impl: str = "auto"):
        super().__init__(tau, decay_input, v_threshold, v_reset, surrogate_function, detach_reset, step_mode,
                         store_v_seq, impl)


@jax.custom_vjp
def _replace_for_grad(x: jax.Array, x_r: jax.Array) -> jax.Array:
    """``x_r``'s value; the backward hands the cotangent to both ``x`` and ``x_r``."""
    return x_r


def _replace_fwd(x, x_r):
    return x_r, None


def _replace_bwd(_, g):
    return g, g


_replace_for_grad.defvjp(_replace_fwd, _replace_bwd)


def grad_with_trace(layer: nnx.Module, pair: SpikeTrace) -> jax.Array:
    """``layer(pair.spike)``'s value, differentiated as ``layer`` applied to the trace with the input gradient
    going to the spikes (SpikingJelly's ``GradwithTrace``): the layer runs twice, once without gradient."""
    out = jax.lax.stop_gradient(layer(pair.spike))
    out_for_grad = layer(_replace_for_grad(pair.spike, pair.trace))
    return _replace_for_grad(out_for_grad, out)


def has_params(layer: nnx.Module) -> bool:
    """Whether ``layer`` holds any ``nnx.Param``."""
    return bool(jax.tree.leaves(nnx.state(layer, nnx.Param)))


def call_layer(layer: nnx.Module, x):
    """One layer on ``x``, an array or a ``SpikeTrace`` (SpikingJelly's ``OTTTSequential``): an ``OTTTLIFNode`` takes
    the spikes, a layer with parameters ``grad_with_trace``, any other layer both (stacked on the time axis, so a
    dropout shared over time masks both alike; the trace without gradient).

    A module that runs its layers through ``call_layer`` (``Sequential``, ``CIFAR10DVSVGG`` and its blocks) says so
    with the class attribute ``hands_on_traces = True``: ``method="ottt"`` trains a model only where each
    ``OTTTLIFNode`` is held by such a module (``snnjax.train.online.check_model``)."""
    if not isinstance(x, SpikeTrace):
        return layer(x)
    if isinstance(layer, OTTTLIFNode):
        return layer(x.spike)
    if has_params(layer):
        return grad_with_trace(layer, x)
    t = x.spike.shape[0]
    both = layer(jnp.concatenate([x.spike, jax.lax.stop_gradient(x.trace)], axis=0))
    return SpikeTrace(both[:t], jax.lax.stop_gradient(both[t:]))
