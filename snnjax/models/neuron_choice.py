"""The spiking neuron a model builds where SpikingJelly takes ``spiking_neuron`` (and its keywords).

Models take the neuron as config-friendly keywords: ``neuron`` (``IF``, ``LIF``, ``PLIF``) and
the options SpikingJelly passes through ``**kwargs`` to every neuron (``tau``, which is PLIF's
``init_tau``; ``decay_input``; ``v_threshold``; ``v_reset``, None for soft reset;
``surrogate_function``; ``detach_reset``). IF ignores ``tau`` and ``decay_input``.
"""
from __future__ import annotations

from flax import nnx

from snnjax.neurons import IFNode, LIFNode, ParametricLIFNode
from snnjax.neurons.surrogate import Surrogate

NEURONS = ("IF", "LIF", "PLIF")


def neuron_options(neuron: str, *, tau: float, decay_input: bool, v_threshold: float, v_reset: float | None,
                   surrogate_function: Surrogate, detach_reset: bool) -> dict:
    """The checked options of one neuron kind, as ``make_neuron`` takes them."""
    if neuron not in NEURONS:
        raise ValueError(f"model.neuron must be one of {NEURONS}, got {neuron!r}")
    return dict(neuron=neuron, tau=tau, decay_input=decay_input, v_threshold=v_threshold, v_reset=v_reset,
                surrogate_function=surrogate_function, detach_reset=detach_reset)


def make_neuron(neuron: str, *, tau: float, decay_input: bool, v_threshold: float, v_reset: float | None,
                surrogate_function: Surrogate, detach_reset: bool) -> nnx.Module:
    """A fresh multi-step neuron (``[T, ...] -> [T, ...]`` spikes)."""
    common = dict(v_threshold=v_threshold, v_reset=v_reset, surrogate_function=surrogate_function,
                  detach_reset=detach_reset, step_mode="m")
    if neuron == "IF":
        return IFNode(**common)
    if neuron == "LIF":
        return LIFNode(tau=tau, decay_input=decay_input, **common)
    if neuron == "PLIF":
        return ParametricLIFNode(init_tau=tau, decay_input=decay_input, **common)
    raise ValueError(f"model.neuron must be one of {NEURONS}, got {neuron!r}")
