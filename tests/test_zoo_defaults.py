"""SpikingJelly's constructor calls build SpikingJelly's neurons: every neuron site of each zoo constructor, with
``spiking_neuron=None`` and with a class and keywords, against ``tests/fixtures/spikingjelly/defaults.json``
(SpikingJelly 2.0.0's models walked by ``make_defaults.py``): the neuron class, ``tau`` / ``init_tau``,
``v_threshold``, ``v_reset``, ``decay_input``, ``detach_reset`` and the surrogate with its ``alpha``, compared as
the multiset of sites (how many neurons resolve to each setting). Where SpikingJelly's call builds no neuron
(``spiking_neuron=None`` for the ResNets and the parametric-LIF nets) snnjax's raises ``ValueError``.
"""
from __future__ import annotations

import collections
import json
import math
import pathlib

import pytest
from flax import nnx

from snnjax import models, neurons
from snnjax.neurons import surrogate as sg
from snnjax.neurons.modules import BaseNode

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "spikingjelly" / "defaults.json"
CASES = json.loads(FIXTURE.read_text())


def snnjax_args(args: dict) -> dict:
    """The fixture's call with snnjax's neuron class and surrogate objects."""
    out = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    if "spiking_neuron" in out:
        out["spiking_neuron"] = getattr(neurons, out["spiking_neuron"])
    if "surrogate_function" in out:
        s = out["surrogate_function"]
        out["surrogate_function"] = getattr(sg, s["surrogate"])(alpha=s["alpha"])
    return out


def site(m: BaseNode) -> tuple:
    """The fields ``make_defaults.site`` records, floats rounded so float32 parameters compare."""
    lif, plif = isinstance(m, neurons.LIFNode), isinstance(m, neurons.ParametricLIFNode)
    init_tau = round(1.0 + math.exp(-float(m.w[...])), 5) if plif else None
    return (type(m).__name__, m.tau if lif else None, init_tau, m.v_threshold, m.v_reset,
            m.decay_input if (lif or plif) else None, m.detach_reset, type(m.surrogate_function).__name__,
            m.surrogate_function.alpha)


def reference_site(s: list) -> tuple:
    return (*s[:2], None if s[2] is None else round(s[2], 5), *s[3:])


def test_fixture_covers_every_constructor():
    want = {"spiking_resnet18", "spiking_resnet34", "spiking_resnet50", "sew_resnet18", "sew_resnet34",
            "sew_resnet50", "ms_resnet18", "ms_resnet34", "DVSGestureNet", "CIFAR10DVSNet", "NMNISTNet",
            "SpikeDrivenTransformer", "QKFormer", "CIFAR10DVSVGG", "Spikformer"}
    assert want <= {c["constructor"] for c in CASES.values()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_neurons_resolve_as_spikingjelly(name):
    case = CASES[name]
    build = getattr(models, case["constructor"])
    kwargs = {**snnjax_args(case["args"]), **snnjax_args(case["snnjax_extra"])}
    if "error" in case:
        with pytest.raises(ValueError, match="needs spiking_neuron"):
            build(**kwargs)
        return
    # PLIF's init_tau lives in its parameter: those models are built (small); the rest only abstractly.
    plif = kwargs.get("spiking_neuron") is neurons.ParametricLIFNode
    model = build(**kwargs) if plif else nnx.eval_shape(lambda: build(**kwargs))
    got = [site(m) for _, m in nnx.iter_modules(model) if isinstance(m, BaseNode)]
    want = [reference_site(s) for s in case["sites"]]
    assert collections.Counter(got) == collections.Counter(want)
    assert all(m.step_mode == "m" for _, m in nnx.iter_modules(model) if isinstance(m, BaseNode))
