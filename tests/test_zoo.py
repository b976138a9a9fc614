"""The model zoo (Spiking ResNet, SEW-ResNet, SpikingJelly's parametric-LIF nets, MS-ResNet): architectures, layers,
losses, weight import, and SpikingJelly's golden data (``tests/fixtures/spikingjelly/zoo.npz``, ``ms_resnet.npz``):
every case with the xla neuron implementation, and the voting net with native too. ``tests/test_neuron_impls.py``
compares xla, native and pallas on every neuron case.

Programs compile with ``conftest.quick_compiles`` (XLA:CPU without its expensive optimisations).
"""
from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import suite_cases

from snnjax import layers
from snnjax import neurons as F
from snnjax.interop import check
from snnjax.interop.spikingjelly import import_state_dict
from snnjax.models import DVSGestureNet, MaxResNet, MSResNet, NMNISTNet, ParametricLIFNet, ResNet, sew_resnet18
from snnjax.models.registry import DataShape, create_model, model_config, sizes_from_data
from snnjax.neurons import surrogate as sg
from snnjax.train.step import classification_loss

ZOO = pathlib.Path(__file__).parent / "fixtures" / "spikingjelly" / "zoo.npz"
MS_RESNET = ZOO.with_name("ms_resnet.npz")
ZOO_CASES = ("spiking_resnet18", "sew_resnet18_add", "sew_resnet50_iand", "dvsgesture_net")
MS_CASES = ("ms_resnet", "ms_resnet_plif", "max_resnet")
# native in a model: the voting net (PLIF, its w gradient too); each neuron kind and surrogate (IF, MS-ResNet's LIF
# with Rect) runs through every implementation in test_neuron_impls.py, and the model's dispatch is the same
# (the suite: MS-ResNet with PLIF only under SNNJAX_ALL_CASES=1; PLIF itself runs in the voting net)
GOLDEN = suite_cases([(name, "xla") for name in ZOO_CASES + MS_CASES] + [("dvsgesture_net", "native")],
                     [(name, "xla") for name in ZOO_CASES + MS_CASES if name != "ms_resnet_plif"]
                     + [("dvsgesture_net", "native")])


pytestmark = pytest.mark.usefixtures("quick_compiles_module")


def n_params(model):
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("depth,cnf,params", [(18, None, 11.69e6), (34, "ADD", 21.80e6), (50, "IAND", 25.56e6)])
def test_resnets_have_torchvisions_sizes(depth, cnf, params):
    """SpikingJelly's ResNets are torchvision's with neurons: the same parameter counts (IF neurons have none)."""
    model = nnx.eval_shape(lambda: ResNet(depth=depth, cnf=cnf, spiking_neuron=F.IFNode, rngs=nnx.Rngs(0)))
    assert n_params(model) == pytest.approx(params, rel=1e-3)
    assert model.fc.kernel.shape == (512 * (4 if depth == 50 else 1), 1000)
    assert [len(s) for s in model.stages()] == ([2, 2, 2, 2] if depth == 18 else [3, 4, 6, 3])
    assert hasattr(model.layer2[0], "downsample_sn") == (cnf is not None)


@pytest.mark.parametrize("name,params", [("ms_resnet18", 11_693_736), ("ms_resnet34", 21_801_896),
                                         ("max_resnet18", 12_502_090)])
def test_ms_resnets_have_spikingjellys_sizes(name, params):
    """Parameter counts of SpikingJelly 2.0.0's ``ms_resnet18`` / ``ms_resnet34`` (1000 classes) and ``max_resnet18``
    (10 classes); a ResNet-18's plus layer1.0's shortcut (the first stage strides)."""
    sizes = {"in_channels": 3, "num_classes": 10 if name == "max_resnet18" else 1000, "T": 4}
    model = nnx.eval_shape(lambda: create_model(name, sizes, rngs=nnx.Rngs(0)))
    assert n_params(model) == params
    assert model.layer1[0].has_downsample and (name == "max_resnet18") == (model.layer2[0].pool_stride > 0)


def test_ms_resnet_neurons_resolve_as_spikingjelly():
    """No neuron class: MS-ResNet's LIF (keywords over it); a class: its own defaults, MS-ResNet's dropped."""
    def neuron(fn=MSResNet, **kw):
        return nnx.eval_shape(lambda: fn(layers=(1, 1, 1), base_channels=4, **kw, rngs=nnx.Rngs(0))
                              ).layer2[0].spike2.config

    assert neuron() == F.NeuronConfig(kind="LIF", tau=4 / 3, decay_input=False, v_threshold=0.5, detach_reset=True,
                                      surrogate=sg.Rect(alpha=2.0))
    assert neuron(v_threshold=1.0, v_reset=None) == F.NeuronConfig(
        kind="LIF", tau=4 / 3, decay_input=False, v_threshold=1.0, v_reset=None, detach_reset=True,
        surrogate=sg.Rect(alpha=2.0))
    plif = neuron(spiking_neuron=F.ParametricLIFNode, detach_reset=True)
    assert plif == F.NeuronConfig(kind="PLIF", detach_reset=True)  # PLIF's own defaults (init_tau 2, sigmoid)
    assert neuron(MaxResNet) == F.NeuronConfig(kind="LIF", tau=2.0, detach_reset=True)
    c = model_config("ms_resnet18")
    assert c.spiking_neuron is None and c.tau is None and c.layers == (2, 2, 2, 2) and c.v_reset == 0.0
    c.spiking_neuron, c.surrogate_function = "IF", "rect"  # typed placeholders: settable from the command line
    options = {k: v for k, v in c.items() if k != "name" and v is not None}  # as the trainer passes them
    model = nnx.eval_shape(lambda: create_model("ms_resnet18", {**options, "in_channels": 2, "num_classes": 3, "T": 2,
                                                                "layers": (1, 1, 1), "base_channels": 4},
                                                rngs=nnx.Rngs(0)))
    assert model.head_lif.config == F.NeuronConfig(kind="IF", surrogate=sg.Rect())
    with pytest.raises(ValueError, match="model.layers"):
        MSResNet(layers=(1, 1), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="model.stage_channels"):
        MSResNet(layers=(1, 1, 1), stage_channels=(4, 8), rngs=nnx.Rngs(0))


def test_plif_net_presets_are_spikingjellys():
    g = nnx.eval_shape(lambda: DVSGestureNet(spiking_neuron=F.ParametricLIFNode))
    assert len(g.features) == 5 and g.fc1.kernel.shape == (128 * 4 * 4, 512) and g.fc2.kernel.shape == (512, 110)
    assert type(g.sn1).__name__ == "ParametricLIFNode" and g.dropout1.broadcast_dims == (0,)
    n = nnx.eval_shape(lambda: NMNISTNet(spiking_neuron=F.ParametricLIFNode))
    assert n.fc1.kernel.shape == (128 * 8 * 8, 2048) and n.fc2.kernel.shape == (2048, 100)  # 34 -> 17 -> 8


def test_registry_sizes_and_errors():
    data = DataShape((64, 64, 2), 11, 4)
    assert sizes_from_data("sew_resnet18", data) == {"in_channels": 2, "num_classes": 11}
    assert model_config("sew_resnet50").cnf == "ADD" and model_config("sew_resnet50").depth == 50
    assert model_config("spiking_resnet34").cnf is None
    assert model_config("nmnist_net").stages == 2
    with pytest.raises(ValueError, match="at least 128x128"):
        sizes_from_data("dvsgesture_net", data, {"stages": 7})
    with pytest.raises(ValueError, match="cnf must be None"):
        create_model("sew_resnet18", {"cnf": "OR", "in_channels": 2, "num_classes": 3}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="spiking_neuron='Izhikevich' is not a neuron name"):
        create_model("nmnist_net", {"spiking_neuron": "Izhikevich"}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="nmnist_net|ParametricLIFNet needs spiking_neuron"):
        create_model("nmnist_net", {}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="sew_resnet18 needs cnf"):
        sew_resnet18(spiking_neuron=F.IFNode)
    with pytest.raises(ValueError, match="sew_resnet18 takes no keyword 'tau'.*a keyword of IFNode"):
        sew_resnet18(cnf="ADD", spiking_neuron=F.IFNode, tau=2.0)
    with pytest.raises(ValueError, match="groups=32 is not supported"):
        sew_resnet18(cnf="ADD", spiking_neuron=F.IFNode, groups=32)
    with pytest.raises(ValueError, match="pretrained=True"):
        sew_resnet18(pretrained=True, cnf="ADD", spiking_neuron=F.IFNode)


def test_sew_connect_and_voting():
    a, b = jnp.array([0.0, 0.0, 1.0, 1.0]), jnp.array([0.0, 1.0, 0.0, 1.0])
    assert layers.sew_connect(a, b, "ADD").tolist() == [0, 1, 1, 2]
    assert layers.sew_connect(a, b, "AND").tolist() == [0, 0, 0, 1]
    assert layers.sew_connect(a, b, "IAND").tolist() == [0, 0, 1, 0]
    x = jnp.arange(12.0).reshape(1, 12)
    assert layers.vote(x, 4).tolist() == [[1.5, 5.5, 9.5]]
    with pytest.raises(ValueError, match="multiple of 5"):
        layers.vote(x, 5)


def test_mse_loss_is_spikingjellys_rate_loss():
    out = jax.random.uniform(jax.random.key(0), (4, 3, 11))
    labels = jnp.array([0, 5, 10])
    rate = out.mean(0)
    want = jnp.mean(jnp.square(rate - jax.nn.one_hot(labels, 11)), axis=-1)
    np.testing.assert_allclose(classification_loss(out, labels, "mse"), want, rtol=1e-6)


def _zoo_state_dict(case: str) -> dict[str, np.ndarray]:
    with np.load(ZOO) as arrays:
        return check.case_arrays(arrays, f"{case}/init/")


def _fixture_resnet(**overrides):
    """The fixture's SEW-ResNet, its variables abstract (the import gives them values)."""
    kw = dict(depth=18, cnf="ADD", widths=(2, 4, 8, 16), in_channels=2, num_classes=10, spiking_neuron="PLIF")
    return nnx.eval_shape(lambda: ResNet(**{**kw, **overrides}, rngs=nnx.Rngs(0)))


def test_import_covers_every_variable_and_names_the_problem():
    sd = _zoo_state_dict("sew_resnet18_add")
    model = _fixture_resnet()
    import_state_dict(model, sd)
    np.testing.assert_allclose(model.layer2[0].downsample_conv.kernel[...],
                               sd["layer2.0.downsample.0.weight"].transpose(2, 3, 1, 0), rtol=1e-6)
    np.testing.assert_allclose(model.layer3[1].sn2.w[...], sd["layer3.1.sn2.w"], rtol=1e-6)
    with pytest.raises(ValueError, match="shape mismatch"):
        import_state_dict(_fixture_resnet(widths=(2, 4, 8, 32)), sd)
    with pytest.raises(KeyError, match="does not provide"):  # a ResNet-34's blocks are not in a ResNet-18's weights
        import_state_dict(_fixture_resnet(depth=34), sd)
    with pytest.raises(KeyError, match="does not exist in the model"):  # PLIF weights into IF neurons
        import_state_dict(_fixture_resnet(spiking_neuron="IF"), sd)
    with pytest.raises(KeyError, match="no counterpart"):
        import_state_dict(_fixture_resnet(), {**sd, "layer1.0.attn.weight": np.zeros(3)})


def test_plif_net_import_permutes_the_flatten():
    sd = _zoo_state_dict("dvsgesture_net")
    model = nnx.eval_shape(lambda: ParametricLIFNet(stages=5, channels=8, hidden_features=32, image_size=64,
                                                    num_classes=11, dropout=0.0, spiking_neuron="PLIF",
                                                    rngs=nnx.Rngs(0)))
    import_state_dict(model, sd)
    w = sd["conv_fc.22.weight"].reshape(32, 8, 2, 2)  # torch flattens [C, H, W]; ours is [H, W, C]
    np.testing.assert_allclose(model.fc1.kernel[...][(1 * 2 + 0) * 8 + 5], w[:, 5, 1, 0], rtol=1e-6)


def test_ms_resnet_import_covers_every_variable_and_names_the_problem():
    with np.load(MS_RESNET) as arrays:
        sd = check.case_arrays(arrays, "ms_resnet_plif/init/")
    kw = dict(layers=(1, 1, 1), base_channels=8, stem_kernel_size=3, stem_stride=1, stem_pool=True,
              in_channels=3, num_classes=10, spiking_neuron="PLIF")

    def model(**overrides):
        return nnx.eval_shape(lambda: MSResNet(**{**kw, **overrides}, rngs=nnx.Rngs(0)))

    m = model()
    import_state_dict(m, sd, dtype=jnp.float32)
    np.testing.assert_allclose(m.layer2[0].downsample_conv.kernel[...],
                               sd["layer2.0.downsample.0.weight"].transpose(2, 3, 1, 0), rtol=1e-6)
    np.testing.assert_allclose(m.stem_bn.var[...], sd["stem.1.running_var"], rtol=1e-6)
    np.testing.assert_allclose(m.head_lif.w[...], sd["head_lif.w"], rtol=1e-6)
    with pytest.raises(ValueError, match="shape mismatch"):
        import_state_dict(model(base_channels=4), sd, dtype=jnp.float32)
    with pytest.raises(KeyError, match="does not provide"):  # a second block per stage is not in the weights
        import_state_dict(model(layers=(2, 1, 1)), sd, dtype=jnp.float32)
    with pytest.raises(KeyError, match="does not exist in the model"):  # PLIF weights into LIF neurons
        import_state_dict(model(spiking_neuron=None), sd, dtype=jnp.float32)
    with pytest.raises(KeyError, match="no counterpart"):
        import_state_dict(m, {**sd, "layer1.0.sn1.w": np.zeros(())}, dtype=jnp.float32)


@functools.cache
def _golden(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    cases, arrays = check.load(path)
    with arrays:
        return cases, dict(arrays)


def test_golden_cases_are_all_listed():
    """``GOLDEN`` checks every case of both files; every MS-ResNet neuron layer fires in the reference."""
    assert set(_golden(ZOO)[0]) == set(ZOO_CASES)
    ms_cases = _golden(MS_RESNET)[0]
    assert set(ms_cases) == set(MS_CASES)
    assert all(c["min_neuron_rate_train"] > 0 for c in ms_cases.values())  # the head's neurons too


@pytest.mark.parametrize("name,impl", GOLDEN)
def test_zoo_matches_spikingjelly(name, impl, x64):
    """Eval/train outputs, loss (CE; MSE for the voting net), every gradient, BN statistics."""
    cases, arrays = _golden(ZOO if name in ZOO_CASES else MS_RESNET)
    r = check.check_model_case(cases[name], check.case_arrays(arrays, f"{name}/"), impl)
    assert r["ok"], r
    assert r["grads_missing"] == 0 and r["grads_checked"] > 20
    assert r["logits_train"] < 1e-12 and r["bn_state_max"] < 1e-12
