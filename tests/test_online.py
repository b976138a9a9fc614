"""Online training through time against SpikingJelly 2.0.0 (``fixtures/spikingjelly/online.*``, float64).

The neurons (``OTTTLIFNode``, ``SLTTLIFNode``): spikes, potentials, traces and the per-step input gradients of
SpikingJelly's training mode. Training: SpikingJelly's ``ottt_online_training`` with SGD (momentum) on its OTTT VGG
at small widths (gradients summed over T) and on an SLTT net with BatchNorm (``online=True``: an update per time
step); snnjax's weights (and BatchNorm statistics) after every batch equal SpikingJelly's, on one device and
under data x fsdp x tensor.
"""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import COMPILER_OPTIONS, load_config

import snnjax
from snnjax import layers, parallel
from snnjax.deploy.nir import to_nir
from snnjax.interop.check import parse_surrogate
from snnjax.interop.spikingjelly import convert_state_dict, import_state_dict
from snnjax.models import OTTTSpikingVGG
from snnjax.neurons import OTTTLIFNode, SLTTLIFNode
from snnjax.neurons.online import SpikeTrace, ottt_traces
from snnjax.parallel import mesh as mesh_lib
from snnjax.train import online, validate
from snnjax.train.loop import step_config
from snnjax.train.sharded import apply_plan
from snnjax.train.step import StepConfig, TrainState, split_model

TOL = 1e-12  # against SpikingJelly (observed: below 1e-14)
LAYOUT = "data=2,fsdp=2,tensor=2"


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module):
    yield
    _train.cache_clear()


@functools.cache
def _golden(reference_dir):
    return np.load(reference_dir / "online.npz"), json.loads((reference_dir / "online.json").read_text())


def _state_dict(arrays, prefix):
    return {k[len(prefix):]: arrays[k] for k in arrays.files if k.startswith(prefix)}


@pytest.mark.parametrize("i", range(4))
def test_neuron_matches_spikingjelly(reference_dir, i):
    arrays, meta = _golden(reference_dir)
    case = meta["neurons"][i]
    kwargs = {k: parse_surrogate(v) if k == "surrogate_function" else v for k, v in case["kwargs"].items()}
    cls = {"OTTTLIFNode": OTTTLIFNode, "SLTTLIFNode": SLTTLIFNode}[case["class"]]
    p = f"neuron{i:03d}/"
    x, gs = jnp.asarray(arrays[p + "x"]), jnp.asarray(arrays[p + "grad_spikes"])
    node = cls(step_mode="m", **kwargs)
    # multi-step: the state is cut from the graph every step, so autodiff gives SpikingJelly's per-step gradients
    (spikes, v_seq), vjp = jax.vjp(lambda x: node.multi_step(x, return_v_seq=True), x)
    (grad_x,) = vjp((gs, jnp.zeros_like(v_seq)))
    np.testing.assert_array_equal(spikes, arrays[p + "spikes"])
    np.testing.assert_allclose(v_seq, arrays[p + "v_seq"], atol=TOL)
    np.testing.assert_allclose(grad_x, arrays[p + "grad_x"], atol=TOL)
    if cls is OTTTLIFNode:  # single-step calls hand on (spike, trace) inside ottt_traces()
        single = cls(**kwargs)
        with ottt_traces():
            outs = [single(x[t]) for t in range(x.shape[0])]
        assert all(isinstance(o, SpikeTrace) for o in outs)
        np.testing.assert_array_equal(np.stack([o.spike for o in outs]), arrays[p + "spikes"])
        np.testing.assert_allclose(np.stack([o.trace for o in outs]), arrays[p + "trace"], atol=TOL)
        assert not isinstance(single(x[0]), SpikeTrace)  # outside the context: spikes only


def _model(name, meta, arrays):
    kw = dict(param_dtype=jnp.float64)
    if name.startswith("ottt_vgg"):
        model = OTTTSpikingVGG(cfg=meta["vgg_cfg"], in_channels=3, num_classes=meta["num_classes"],
                               spiking_neuron=OTTTLIFNode, **kw)
    else:
        rngs = nnx.Rngs(0)
        model = snnjax.Sequential(layers.conv2d(3, 6, 3, padding=1, rngs=rngs, **kw), layers.BatchNorm(6, **kw),
                                  SLTTLIFNode(step_mode="m"), layers.AvgPool2d(2), layers.Flatten("chw"),
                                  layers.linear(96, meta["num_classes"], rngs=rngs, **kw))
    import_state_dict(model, _state_dict(arrays, f"{name}/init/"), dtype=jnp.float64)
    return model


@functools.cache
def _train(reference_dir, name, layout):
    """``(model, [(loss, params and model state flat by path) after each batch])`` of case ``name`` trained as
    SpikingJelly was, on one device (``layout`` None) or under ``layout``."""
    arrays, meta = _golden(reference_dir)
    case = next(c for c in meta["train"] if c["name"] == name)
    model = _model(name, meta, arrays)
    graphdef, params, rngs, rest = split_model(model)
    tx = optax.sgd(case["lr"], momentum=case["momentum"])
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=tx.init(params))
    cfg = StepConfig(seed=0, time_steps=meta["T"], encoder=None, compute_dtype=jnp.float64,
                     method="ottt" if name.startswith("ottt") else "sltt", online_updates=case["online"])
    devices = jax.devices()[:8 if layout else 1]
    plan = parallel.plan(model, mesh_lib.make_mesh(layout or "data=1", devices), mode="hybrid" if layout else "none")
    state, step = apply_plan(plan, state, cfg, graphdef, tx, batch_axes={"inputs": 1, "labels": 0},
                             batch_ndims={"inputs": 5, "labels": 1})
    compiled, out = None, []
    for b in range(case["batches"]):
        x = (arrays[f"{name}/batch{b}/x"] * case["x_step"]).transpose(1, 0, 3, 4, 2)  # [N, T, C, H, W] -> snnjax's
        batch = {"inputs": jax.device_put(jnp.asarray(x), plan.batch_sharding(5, 1)),
                 "labels": jax.device_put(jnp.asarray(arrays[f"{name}/batch{b}/labels"]), plan.batch_sharding(1, 0))}
        compiled = compiled or step.lower(state, batch).compile(compiler_options=COMPILER_OPTIONS)
        state, metrics = compiled(state, batch)
        values = [*nnx.to_flat_state(jax.device_get(state.params)),
                  *nnx.to_flat_state(jax.device_get(state.model_state))]
        out.append((float(metrics["loss"]), {p: np.asarray(v.get_value()) for p, v in values}))
    return model, out


@pytest.mark.parametrize("name,layout", [("ottt_vgg", None), ("ottt_vgg", LAYOUT), ("sltt_online", None)])
def test_training_matches_spikingjelly(reference_dir, name, layout):
    arrays, meta = _golden(reference_dir)
    model, steps = _train(reference_dir, name, layout)
    for b, (loss, values) in enumerate(steps):
        # SpikingJelly's batch loss is the sum over steps; snnjax reports their mean
        assert abs(loss * meta["T"] - float(arrays[f"{name}/batch{b}/loss"])) < 1e-10
        want = convert_state_dict(model, _state_dict(arrays, f"{name}/after{b}/"))
        assert set(want) <= set(values)
        for path, w in want.items():
            np.testing.assert_allclose(values[path], w, atol=TOL, err_msg=f"batch {b}: {path}")
    if layout is not None:  # the layout against one device, directly
        ref = _train(reference_dir, name, None)[1]
        for (_, values), (_, ref_values) in zip(steps, ref, strict=True):
            for path, v in ref_values.items():
                np.testing.assert_allclose(values[path], v, atol=1e-9, err_msg=str(path))


class _OwnNet(nnx.Module):
    """A model of one's own that calls an OTTTLIFNode directly (no call_layer)."""

    def __init__(self, rngs):
        self.fc, self.neuron, self.out = layers.linear(4, 3, rngs=rngs), OTTTLIFNode(step_mode="m"), layers.linear(
            3, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(self.neuron(self.fc(x)))


def test_cifar10dvs_vgg_trains_as_its_sequential():
    """CIFAR10DVSVGG with OTTTLIFNode under method="ottt" equals a Sequential of the same layers (the OTTTSequential
    semantics checked against SpikingJelly above): loss and every weight after 2 batches, float64."""
    vgg = snnjax.models.CIFAR10DVSVGG(widths=(4, 6), pools=(False, True), image_size=8, num_classes=3,
                                      spiking_neuron=OTTTLIFNode, rngs=nnx.Rngs(params=0, dropout=1),
                                      param_dtype=jnp.float64)
    blocks = [layer for b in vgg.features for layer in (b.avgpool, b.conv, b.bn, b.neuron) if layer is not None]
    seq = snnjax.Sequential(*blocks, vgg.pool, vgg.flatten, vgg.dropout, vgg.classifier)
    rng = np.random.default_rng(0)
    batches = [{"inputs": (rng.random((4, 4, 8, 8, 2)) < 0.4) * 1.5, "labels": rng.integers(0, 3, 4)}
               for _ in range(2)]
    runs = []
    for net in (vgg, seq):
        trainer = snnjax.trainer(net, "data=1", optax.sgd(0.5, momentum=0.9), devices=jax.devices()[:1],
                                 dtype=jnp.float64, method="ottt", verbose=False, donate=False)
        runs.append(([trainer.step(b)["loss"] for b in batches], trainer.model()))
    (loss_v, trained_v), (loss_s, trained_s) = runs
    np.testing.assert_allclose(loss_v, loss_s, rtol=1e-12)
    pairs = [(b.conv, trained_s.layers[i]) for b, i in zip(trained_v.features, (0, 4), strict=True)]
    pairs += [(b.bn, trained_s.layers[i]) for b, i in zip(trained_v.features, (1, 5), strict=True)]
    pairs += [(trained_v.classifier, trained_s.layers[-1])]
    assert np.abs(trained_v.features[0].conv.kernel.get_value() - vgg.features[0].conv.kernel.get_value()).min() > 0
    for a, b in pairs:
        for (path, x), (_, y) in zip(nnx.to_flat_state(nnx.state(a)),
                                     nnx.to_flat_state(nnx.state(b)), strict=True):
            np.testing.assert_allclose(x.get_value(), y.get_value(), atol=1e-12, err_msg=str(path))


def test_refusals():
    """What cannot train online says what to change."""
    def abstract(build):  # the structure alone: nothing initialised
        return nnx.eval_shape(lambda: build(nnx.Rngs(0)))

    plain = abstract(lambda r: snnjax.Sequential(layers.linear(4, 3, rngs=r)))
    with pytest.raises(ValueError, match="no spiking neuron"):
        online.check_model(plain, "sltt")
    lif = abstract(lambda r: snnjax.Sequential(layers.linear(4, 3, rngs=r), snnjax.neurons.LIFNode(step_mode="m")))
    with pytest.raises(ValueError, match="no OTTTLIFNode"):
        online.check_model(lif, "ottt")
    online.check_model(lif, "sltt")
    psn = abstract(lambda r: snnjax.Sequential(layers.linear(4, 3, rngs=r), snnjax.neurons.PSN(T=2, rngs=r)))
    with pytest.raises(ValueError, match=r"\['PSN'\], parallel spiking neurons"):
        online.check_model(psn, "sltt")
    own = abstract(lambda r: _OwnNet(r))
    with pytest.raises(ValueError, match="neuron in a _OwnNet, whose layers do not take its"):
        online.check_model(own, "ottt")
    with pytest.raises(ValueError, match="not a training method"):
        online.check_model(lif, "eprop")
    c = load_config("digits", "--config.train_method=ottt", "--config.parallel.mode=pp",
                    "--config.parallel.mesh=stage=2,data=-1")
    with pytest.raises(ValueError, match="parallel.mode='pp' is not supported"):
        validate(c)
    with pytest.raises(ValueError, match="online_updates=True applies"):
        validate(load_config("digits", "--config.online_updates=true"))
    with pytest.raises(ValueError, match="train_method='eprop' is not allowed"):
        validate(load_config("digits", "--config.train_method=eprop"))


def test_nir_exports_the_standardised_kernel():
    """A weight-standardised layer exports the kernel it computes with (the OTTT VGG's convs)."""
    rngs = nnx.Rngs(0)
    net = snnjax.Sequential(layers.conv2d(2, 3, 3, padding=1, rngs=rngs, weight_standardization=True),
                            snnjax.neurons.LIFNode(step_mode="m"), layers.Flatten("chw"),
                            layers.linear(48, 2, rngs=rngs, weight_standardization=True))
    graph = to_nir(net, (4, 4, 2))
    np.testing.assert_allclose(graph.nodes["layers_0"].weight, np.transpose(net.layers[0].standardized_kernel(),
                                                                            (3, 2, 0, 1)), rtol=1e-6)
    np.testing.assert_allclose(graph.nodes["layers_3"].weight, net.layers[3].standardized_kernel().T, rtol=1e-6)


def test_config_reaches_the_step():
    """``train_method`` / ``online_updates`` of a config (train.py's) become the step's settings."""
    c = load_config("digits", "--config.train_method=sltt", "--config.online_updates=true")
    validate(c)
    cfg = step_config(c, time_major=False)
    assert (cfg.method, cfg.online_updates) == ("sltt", True)
