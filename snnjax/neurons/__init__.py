"""Spiking neurons: surrogate gradients, a pure functional core and Flax NNX modules."""
from snnjax.neurons.functional import NeuronConfig, multistep, multistep_reference, step
from snnjax.neurons.modules import IFNode, LIFNode, MembranePotential, ParametricLIFNode, reset_net
from snnjax.neurons.surrogate import ATan, PiecewiseQuadratic, Sigmoid, SoftSign, spike

__all__ = [
    "ATan", "IFNode", "LIFNode", "MembranePotential", "NeuronConfig", "ParametricLIFNode",
    "PiecewiseQuadratic", "Sigmoid", "SoftSign", "multistep", "multistep_reference", "reset_net",
    "spike", "step",
]
