"""Bad neuron hyperparameters fail early with a ValueError that says what is wrong."""
from __future__ import annotations

import jax.numpy as jnp
import pytest

from snnjax import neurons as F
from snnjax.neurons import modules as M
from snnjax.neurons import surrogate as sg


@pytest.mark.parametrize("tau", [1.0, 0.5, 0.0, -2.0, float("nan")])
def test_lif_tau_must_exceed_one(tau):
    with pytest.raises(ValueError, match=r"tau > 1"):
        F.NeuronConfig(kind="LIF", tau=tau)
    with pytest.raises(ValueError, match=r"tau"):
        M.LIFNode(tau=tau)


@pytest.mark.parametrize("init_tau", [1.0, 0.5])
def test_plif_init_tau_must_exceed_one(init_tau):
    with pytest.raises(ValueError, match=r"init_tau"):
        M.ParametricLIFNode(init_tau=init_tau)


@pytest.mark.parametrize("cls", [M.IFNode, M.LIFNode, M.ParametricLIFNode])
@pytest.mark.parametrize("step_mode", ["x", "multi", "S", ""])
def test_bad_step_mode(cls, step_mode):
    with pytest.raises(ValueError, match=r"step_mode must be 's'.*'m'.*" + repr(step_mode)):
        cls(step_mode=step_mode)


@pytest.mark.parametrize("kind", ["ALIF", "lif", "", "QIF"])
def test_bad_kind(kind):
    with pytest.raises(ValueError, match=r"kind must be 'IF', 'LIF' or 'PLIF'"):
        F.NeuronConfig(kind=kind)


def test_unknown_surrogate_name():
    with pytest.raises(ValueError, match=r"unknown surrogate 'relu'.*sigmoid"):
        sg.get("relu")


@pytest.mark.parametrize("fn", [F.multistep, F.multistep_reference], ids=["custom_vjp", "autodiff"])
def test_plif_without_w(fn):
    with pytest.raises(ValueError, match=r"PLIF.*\bw\b"):
        fn(F.NeuronConfig(kind="PLIF"), jnp.ones((2, 3)))


def test_plif_nonscalar_w_is_rejected():
    """One learned time constant per layer: a per-channel w would get a summed (wrong) gradient, so it is refused."""
    cfg = F.NeuronConfig(kind="PLIF", v_reset=None)
    x = jnp.ones((5, 3, 4))
    for fn in (F.multistep, F.multistep_reference):
        with pytest.raises(ValueError, match="must be a scalar"):
            fn(cfg, x, None, jnp.zeros((4,)))
