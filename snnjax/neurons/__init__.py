"""Spiking neurons: surrogate gradients, the shared equations, Flax NNX modules, and the multi-step op's kernels.

Modules (dependencies point down): ``surrogate`` -> ``base`` (config and equations, ``StepNeuron``) -> ``kernels``
(the multi-step op: the ``xla`` reference, ``native`` CPU and ``pallas`` GPU kernels for IF / LIF / PLIF, ``scan``
for any neuron's single step, ``sharded`` and ``temporal`` layouts, and ``dispatch``, the table of
implementations) -> ``modules`` (NNX: ``BaseNode``, every neuron's single step as charge / fire / reset hooks, and
IF / LIF / PLIF) -> ``catalogue`` (SpikingJelly's other neurons through those hooks); ``compare`` (relative
errors and VJPs of any implementation) serves the kernel checks and tests.
"""
from snnjax.neurons import surrogate
from snnjax.neurons.base import NeuronConfig, StepNeuron, multistep_reference, step
from snnjax.neurons.catalogue import (
    ComplementaryLIFNode,
    CUBALIFNode,
    EIFNode,
    GatedLIFNode,
    HalfThresholdIFNode,
    IzhikevichNode,
    KLIFNode,
    LIAFNode,
    NonSpikingIFNode,
    NonSpikingLIFNode,
    QIFNode,
    RAFNode,
    TernaryIFNode,
    TernaryLIFNode,
)
from snnjax.neurons.kernels.dispatch import IMPLS, multistep, resolve_impl
from snnjax.neurons.modules import BaseNode, IFNode, LIFNode, MembranePotential, ParametricLIFNode, reset_net, set_impl
from snnjax.neurons.surrogate import ATan, PiecewiseQuadratic, Rect, Sigmoid, SoftSign, spike

__all__ = [
    "ATan", "BaseNode", "CUBALIFNode", "ComplementaryLIFNode", "EIFNode", "GatedLIFNode", "HalfThresholdIFNode",
    "IFNode", "IMPLS", "IzhikevichNode", "KLIFNode", "LIAFNode", "LIFNode", "MembranePotential", "NeuronConfig",
    "NonSpikingIFNode", "NonSpikingLIFNode", "ParametricLIFNode", "PiecewiseQuadratic", "QIFNode", "RAFNode", "Rect",
    "Sigmoid", "SoftSign", "StepNeuron", "TernaryIFNode", "TernaryLIFNode", "multistep", "multistep_reference",
    "reset_net", "resolve_impl", "set_impl", "spike", "step", "surrogate",
]
