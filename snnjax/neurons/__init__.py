"""Spiking neurons: surrogate gradients, the shared base, the implementations' dispatcher, Flax NNX modules.

Modules (dependencies point down): ``surrogate`` -> ``base`` (config and equations) -> ``xla`` (the
``lax.scan`` path), the kernel packages ``snnjax.pallas`` / ``snnjax.native`` (which import only
``base``) and ``sharded`` (the kernels under a multi-device layout) -> ``dispatch`` (the table of
implementations, ``auto``'s choice) -> ``modules`` (NNX); ``compare`` (relative errors and VJPs of any
implementation) serves the kernel checks and tests.
"""
from snnjax.neurons.base import NeuronConfig, multistep_reference, step
from snnjax.neurons.dispatch import IMPLS, multistep, resolve_impl
from snnjax.neurons.modules import IFNode, LIFNode, MembranePotential, ParametricLIFNode, reset_net, set_impl
from snnjax.neurons.surrogate import ATan, PiecewiseQuadratic, Rect, Sigmoid, SoftSign, spike

__all__ = [
    "ATan", "IFNode", "IMPLS", "LIFNode", "MembranePotential", "NeuronConfig", "ParametricLIFNode",
    "PiecewiseQuadratic", "Rect", "Sigmoid", "SoftSign", "multistep", "multistep_reference", "reset_net",
    "resolve_impl", "set_impl", "spike", "step",
]
