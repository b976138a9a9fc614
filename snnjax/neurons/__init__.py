"""Spiking neurons: surrogate gradients, the shared equations, Flax NNX modules, and the multi-step op's kernels.

Modules (dependencies point down): ``surrogate`` -> ``base`` (config and equations) -> ``kernels`` (the
multi-step op: the ``xla`` reference, ``native`` CPU and ``pallas`` GPU kernels, ``sharded`` and ``temporal``
layouts, and ``dispatch``, the table of implementations) -> ``modules`` (NNX); ``psn`` (the parallel spiking
neurons: a matmul over time, no recurrence) takes only ``surrogate``; ``compare`` (relative errors and VJPs of any
implementation) serves the kernel checks and tests.
"""
from snnjax.neurons import surrogate
from snnjax.neurons.base import NeuronConfig, multistep_reference, step
from snnjax.neurons.kernels.dispatch import IMPLS, choose_impl, multistep, resolve_impl
from snnjax.neurons.modules import IFNode, LIFNode, MembranePotential, ParametricLIFNode, reset_net, set_impl
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
    "S2NN", "ATan", "DeterministicPass", "Erf", "FakeNumericalGradient", "IFNode", "IMPLS", "LIFNode", "LeakyKReLU",
    "LogTailedReLU", "MaskedPSN", "PSN", "SlidingPSN", "MembranePotential", "MultiLevelSpikeCount", "NeuronConfig",
    "NonzeroSignLogAbs", "ParametricLIFNode", "PiecewiseExp", "PiecewiseLeakyReLU", "PiecewiseQuadratic",
    "PoissonPass", "QPseudoSpike", "Rect", "Sigmoid", "SoftSign", "SquarewaveFourierSeries", "SuperSpike",
    "choose_impl", "multistep", "multistep_reference", "reset_net", "resolve_impl", "set_impl", "spike", "step",
    "surrogate",
]
