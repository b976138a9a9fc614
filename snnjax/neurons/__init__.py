"""Spiking neurons: surrogate gradients, the shared equations, Flax NNX modules, and the multi-step op's kernels.

Modules (dependencies point down): ``surrogate`` -> ``base`` (config and equations, ``StepNeuron``) -> ``kernels``
(the multi-step op: the ``xla`` reference, ``native`` CPU and ``pallas`` GPU kernels for IF / LIF / PLIF and
generated from any neuron's single step, ``scan`` for any neuron's single step, ``sharded`` and ``temporal``
layouts, and ``dispatch``, the table of implementations) -> ``modules`` (NNX: ``BaseNode``, every neuron's single
step as charge / fire / reset hooks, and IF / LIF / PLIF) -> ``catalogue`` (SpikingJelly's other neurons through
those hooks) and ``online`` (OTTT / SLTT: LIF cut from the graph between steps); ``psn`` (the parallel spiking
neurons: a matmul over time, no recurrence, not a ``BaseNode``) takes ``surrogate`` and ``modules.Stateful``;
``compare`` (relative errors and VJPs of any implementation) serves the kernel checks and tests.
"""
from snnjax.neurons import surrogate
from snnjax.neurons.base import NeuronConfig, StepNeuron, multistep_reference, step
from snnjax.neurons.catalogue import (
    ComplementaryLIFNode,
    CUBALIFNode,
    EIFNode,
    GatedLIFNode,
    HalfThresholdIFNode,
    ILIFNode,
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
from snnjax.neurons.kernels.dispatch import IMPLS, choose_impl, multistep, resolve_impl
from snnjax.neurons.modules import BaseNode, IFNode, LIFNode, MembranePotential, ParametricLIFNode, reset_net, set_impl
from snnjax.neurons.online import OTTTLIFNode, SLTTLIFNode
from snnjax.neurons.psn import PSN, MaskedPSN, SlidingPSN
from snnjax.neurons.surrogate import (
    S2NN,
    ATan,
    DeterministicPass,
    Erf,
    FakeNumericalGradient,
    LeakyKReLU,
    LogTailedReLU,
    MultiLevelSpikeCount,
    NonzeroSignLogAbs,
    PiecewiseExp,
    PiecewiseLeakyReLU,
    PiecewiseQuadratic,
    PoissonPass,
    QPseudoSpike,
    Rect,
    Sigmoid,
    SoftSign,
    SquarewaveFourierSeries,
    SuperSpike,
    spike,
)

__all__ = [
    "S2NN", "ATan", "BaseNode", "CUBALIFNode", "ComplementaryLIFNode", "DeterministicPass", "EIFNode", "Erf",
    "FakeNumericalGradient", "GatedLIFNode", "HalfThresholdIFNode", "IFNode", "ILIFNode", "IMPLS",
    "IzhikevichNode", "KLIFNode", "LIAFNode", "LIFNode", "LeakyKReLU", "LogTailedReLU", "MaskedPSN",
    "MembranePotential", "MultiLevelSpikeCount", "NeuronConfig", "NonSpikingIFNode", "NonSpikingLIFNode",
    "NonzeroSignLogAbs", "OTTTLIFNode", "PSN", "ParametricLIFNode", "PiecewiseExp", "PiecewiseLeakyReLU",
    "PiecewiseQuadratic", "PoissonPass", "QIFNode", "QPseudoSpike", "RAFNode", "Rect", "SLTTLIFNode", "Sigmoid",
    "SlidingPSN", "SoftSign", "SquarewaveFourierSeries", "StepNeuron", "SuperSpike", "TernaryIFNode",
    "TernaryLIFNode", "choose_impl", "multistep", "multistep_reference", "reset_net", "resolve_impl", "set_impl",
    "spike", "step", "surrogate"
]
