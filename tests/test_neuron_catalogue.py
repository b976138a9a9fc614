"""Neurons written as their single step (``BaseNode``'s hooks, the ``scan`` path), in float64: the docs' user-written
LIF against the built-in ``LIFNode``, the catalogue against SpikingJelly 2.0.0 (``catalogue.npz``), state and
modes, a user-written adaptive-threshold LIF against a plain Python loop, and the neurons inside models."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import quick_compiles
from flax import nnx
from helpers import ROOT, AdaptiveLIF
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax import Sequential, layers, neurons
from snnjax.deploy import Streamer, calls
from snnjax.interop import check, spikingjelly
from snnjax.models import SpikingMLP, create_model, neuron_options
from snnjax.models.registry import model_config
from snnjax.neurons import BaseNode, CUBALIFNode, IzhikevichNode, LIFNode, NonSpikingLIFNode
from snnjax.neurons.compare import REFERENCE, run_vjp
from snnjax.neurons.kernels import temporal
from snnjax.parallel import mesh as mesh_lib

pytestmark = pytest.mark.usefixtures("x64_module")


def user_lif_class():
    """``UserLIF`` as docs/neurons.md writes it (the block checked by this file)."""
    text = (ROOT / "docs" / "neurons.md").read_text()
    (code,) = re.findall(r'```python title="checked by tests/test_neuron_catalogue.py"\n(.*?)```', text, re.S)
    assert len(code.strip().splitlines()) <= 15, "the docs promise a LIF in at most 15 lines"
    namespace = {}
    exec(compile(code, "docs/neurons.md", "exec"), namespace)
    return namespace["UserLIF"]


def value_and_grads(node, x, gy):
    """``(spikes, v_seq, dx)`` for the loss ``sum(spikes * gy) + sum(v_seq * gy[::-1])`` (both outputs' gradients)."""
    def loss(x):
        s, v = node.multi_step(x, return_v_seq=True)
        return jnp.sum(s * gy) + jnp.sum(v * gy[::-1]), (s, v)

    (_, (s, v)), dx = jax.value_and_grad(loss, has_aux=True)(x)
    return s, v, dx


@pytest.mark.parametrize("v_reset", [0.0, None, -0.3])
def test_the_docs_user_lif_equals_the_builtin_lif_bitwise(v_reset):
    """On one path (``scan``) the docs' LIF and ``LIFNode`` give the same bits forward and backward; through the
    native kernel generated from its step (what ``auto`` runs on a CPU) the forward is the hand-written native
    kernel's bits and the gradients agree to rounding (the hand-written backward, and the C++ library's exp in
    the surrogate's gradient, round otherwise)."""
    user_lif = user_lif_class()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(0.5, 1.5, (8, 2, 5)))
    gy = jnp.asarray(rng.normal(size=(8, 2, 5)))
    for detach in (False, True):
        kw = dict(tau=1.5, v_reset=v_reset, detach_reset=detach, step_mode="m")
        user = value_and_grads(user_lif(**kw, impl="scan"), x, gy)
        assert 0 < float(user[0].mean()) < 1
        same_path = value_and_grads(LIFNode(**kw, impl="scan"), x, gy)
        for a, b in zip(user, same_path, strict=True):
            np.testing.assert_array_equal(a, b)
        generated = value_and_grads(user_lif(**kw), x, gy)
        kernel = value_and_grads(LIFNode(**kw, impl="native"), x, gy)
        for got in (kernel, same_path):
            np.testing.assert_array_equal(generated[0], got[0])
            np.testing.assert_array_equal(generated[1], got[1])
            np.testing.assert_allclose(generated[2], got[2], rtol=0, atol=1e-14)


@pytest.mark.parametrize("return_v_seq", [False, True])
def test_the_scan_path_of_the_builtins_equals_plain_autodiff(return_v_seq):
    """The step-VJP backward of ``scan`` against autodiff of the whole scan: PLIF (w), a given start state."""
    rng = np.random.default_rng(4)
    x, ct_s, ct_v = (jnp.asarray(rng.normal(0.6, 1.2, (9, 2, 5))) for _ in range(3))
    v_init, w = jnp.asarray(rng.normal(0, 0.3, (2, 5))), jnp.asarray(0.3)
    cfg = neurons.NeuronConfig(kind="PLIF", v_reset=None, surrogate=neurons.ATan())
    ct_v = ct_v if return_v_seq else ct_v[0]
    (s, v), grads = run_vjp("scan", cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    (s_r, v_r), grads_r = run_vjp(REFERENCE, cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    np.testing.assert_array_equal(s, s_r)
    np.testing.assert_allclose(v, v_r, rtol=1e-14, atol=1e-15)
    for g, g_r in zip(grads, grads_r, strict=True):
        np.testing.assert_allclose(g, g_r, rtol=1e-12, atol=1e-14)


def test_the_catalogue_matches_spikingjelly():
    cases, arrays = check.load(ROOT / "tests" / "fixtures" / "spikingjelly" / "catalogue.npz")
    with quick_compiles():  # 20 small programs
        results = dict(check.iter_cases(cases, arrays))
    failed = {name: r for name, r in results.items() if not r["ok"]}
    assert not failed, failed
    ran = {r["impl"] for r in results.values()}
    assert "native" in ran and ran <= {"native", "scan"}  # the kernels generated from the steps where they run
    assert {c["class"] for c in cases} >= set(neurons.catalogue.__all__)


def test_single_step_mode_streams_every_state_variable_and_reset_forgets_it():
    x = jnp.asarray(np.random.default_rng(1).normal(0.3, 0.6, (6, 3)))
    multi = IzhikevichNode(a=0.3, b=0.2, step_mode="m")
    spikes, final = multi.multi_step(x)
    assert set(final) == {"v", "w"}
    single = IzhikevichNode(a=0.3, b=0.2)
    stepped = jnp.stack([single(xt) for xt in x])
    np.testing.assert_array_equal(stepped, spikes)
    np.testing.assert_allclose(single.w.get_value(), final["w"], rtol=1e-14)  # eager steps vs one scan
    single.reset()
    assert float(single.v.get_value()) == 0.0 and float(single.w.get_value()) == 0.0
    # continuing from a given state: the second half from the first half's final state
    first, mid = multi.multi_step(x[:3])
    second, _ = multi.multi_step(x[3:], mid)
    np.testing.assert_array_equal(jnp.concatenate([first, second]), spikes)


def test_a_user_written_adaptive_lif_matches_a_python_loop():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(0.8, 1.0, (10, 2, 4)))
    gy = jnp.asarray(rng.normal(size=(10, 2, 4)))
    node = AdaptiveLIF(step_mode="m")

    def loop(x, w):  # the same equations, unrolled in Python
        v, th, out = jnp.zeros(x.shape[1:]), jnp.ones(x.shape[1:]), []
        for xt in x:
            v = v + (xt - v) * jax.nn.sigmoid(w)
            s = neurons.spike(v - th, neurons.Sigmoid())
            th = th + (1.0 - th) / 4.0 + 0.3 * s
            v = v * (1.0 - s)
            out.append(s)
        return jnp.sum(jnp.stack(out) * gy)

    graphdef, params, rest = nnx.split(node, nnx.Param, ...)
    got, (gx, gp) = jax.jit(jax.value_and_grad(lambda x, p: jnp.sum(nnx.merge(graphdef, p, rest)(x) * gy),
                                               argnums=(0, 1)))(x, params)
    want, (wx, ww) = jax.jit(jax.value_and_grad(loop, argnums=(0, 1)))(x, params["w"][...])
    assert float(got) == pytest.approx(float(want), rel=1e-14)
    np.testing.assert_allclose(gx, wx, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gp["w"][...], ww, rtol=1e-12)


def test_step_neurons_run_in_sequential_and_the_zoo_and_refuse_kernels():
    rngs = nnx.Rngs(0)
    net = Sequential(layers.linear(6, 8, rngs=rngs), CUBALIFNode(step_mode="m"), layers.linear(8, 3, rngs=rngs),
                     NonSpikingLIFNode(decode="mean-mem"))
    x = jnp.asarray(np.random.default_rng(3).random((5, 2, 6)))
    assert net(x).shape == (2, 3)
    mlp = SpikingMLP(6, (8,), 3, spiking_neuron="CUBALIFNode", c_decay=0.3, rngs=rngs)
    assert mlp(x).shape[-1] == 3
    assert {type(m) for _, m in nnx.iter_modules(mlp) if isinstance(m, BaseNode)} == {CUBALIFNode}
    assert neurons.set_impl(mlp, "xla") == 1  # the xla kernels are IF / LIF / PLIF's: the CUBA-LIF's pure-XLA path
    assert {m.impl for _, m in nnx.iter_modules(mlp) if isinstance(m, BaseNode)} == {"scan"}
    li = SpikingMLP(6, (8,), 3, spiking_neuron="CUBALIFNode", readout={"type": "NonSpikingLIFNode", "tau": 3.0},
                    rngs=nnx.Rngs(1))  # the SHD recipe: the readout's potentials [T, N, 3] are the logits
    head = li.head(li.neurons[0](li.fcs[0](x)))
    np.testing.assert_allclose(li(x), NonSpikingLIFNode(tau=3.0)(head), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="reduces over time"):
        SpikingMLP(6, (8,), 3, readout={"type": "NonSpikingLIFNode", "decode": "max-mem"})
    with pytest.raises(ValueError, match="SpikingMLP's readout takes no keyword 'v_reset'"):
        SpikingMLP(6, (8,), 3, readout={"type": "NonSpikingLIFNode", "v_reset": 0.0})
    config = {k: v for k, v in model_config("mlp", spiking_neuron="NonSpikingLIFNode").items()
              if k != "name" and v is not None}  # as the trainer passes them
    built = create_model("mlp", {**config, "in_features": 6, "num_classes": 3}, rngs=nnx.Rngs(0))
    assert isinstance(built.neurons[0], NonSpikingLIFNode)  # the config's v_reset 0.0 left out: the class has none
    klif = Sequential(layers.linear(6, 8, rngs=rngs), neurons.KLIFNode(step_mode="m"))  # SpikingJelly's names
    spikingjelly.import_state_dict(klif, {"0.weight": np.ones((8, 6)), "0.bias": np.zeros(8), "1.k": np.array(1.7)},
                                   dtype=jnp.float64)
    assert float(klif.layers[1].k[...]) == 1.7
    choice = neuron_options.Neurons.of(neurons.QIFNode, {"tau": 3.0, "detach_reset": True}, model="test")
    made = choice.make()
    assert isinstance(made, neurons.QIFNode) and made.tau == 3.0 and made.step_mode == "m"
    with pytest.raises(ValueError, match="takes no keyword 'init_tau'"):
        neuron_options.Neurons.of(neurons.QIFNode, {"init_tau": 2.0}, model="test")
    with pytest.raises(ValueError, match="impl='scan' runs it"):
        CUBALIFNode(step_mode="m", impl="xla")(x)
    choice = neurons.choose_impl("auto", CUBALIFNode().neuron, x)
    assert choice.impl == "native" and "generated from CUBALIFNode's step" in choice.why
    with pytest.raises(ValueError, match="spiking MultiLevelSpikeCount"):
        neurons.ILIFNode(surrogate_function=neurons.Sigmoid())
    with pytest.raises(ValueError, match="CUBALIFNode: .* draws random spikes"):
        CUBALIFNode(surrogate_function=neurons.PoissonPass())


def test_a_psn_beside_step_neurons_resets_and_is_no_base_node():
    """``reset_net`` clears a CUBA-LIF's two state variables and a single-step ``SlidingPSN``'s queue (a
    ``Stateful`` module, not a ``BaseNode``); ``set_impl`` and ``deploy.calls.neurons`` pass the PSN by."""
    rngs = nnx.Rngs(0)
    net = Sequential(layers.linear(3, 4, rngs=rngs), CUBALIFNode(), neurons.SlidingPSN(k=2))
    x = jnp.asarray(np.random.default_rng(7).uniform(0.5, 1.5, (2, 3)))
    net(x)
    cuba, psn = net.layers[1], net.layers[2]
    assert float(jnp.abs(cuba.c.get_value()).sum()) > 0 and psn.queue.get_value().shape == (2, 2, 4)
    neurons.reset_net(net)
    assert float(jnp.abs(cuba.c.get_value()).sum()) == 0 and psn.queue.get_value().shape == ()
    assert neurons.set_impl(net, "scan") == 1 and cuba.impl == "scan"
    assert [path for path, _ in calls.neurons(net)] == ["layers.1"]


@pytest.mark.parametrize("name,v_init,seq", [("user_lif", True, True), ("izhikevich", False, False),
                                             ("klif", True, False)])
def test_step_neurons_split_over_time_equal_one_device(name, v_init, seq):
    """The time pipeline (``time=4,data=2``) runs any single-step neuron: outputs, states and the gradients of
    the input, the start state and the parameters within 1e-9 of one device."""
    node = {"user_lif": lambda: user_lif_class()(tau=1.5, v_reset=None, step_mode="m"),
            "izhikevich": lambda: IzhikevichNode(a=0.3, b=0.2, v_reset=None, step_mode="m"),
            "klif": lambda: neurons.KLIFNode(scale_reset=True, step_mode="m")}[name]()
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(0.5, 1.0, (8, 4, 6)))
    v0 = jnp.asarray(rng.normal(0.0, 0.3, (4, 6)))
    weights = jnp.asarray(rng.normal(size=(8, 4, 6)))
    graphdef, params, rest = nnx.split(node, nnx.Param, ...)

    def grads(x, v0, params):
        def loss(x, v0, params):
            s, v = nnx.merge(graphdef, params, rest).multi_step(x, v0 if v_init else None, return_v_seq=seq)
            v = v if seq else jax.tree.leaves(v)
            return jnp.sum(s * weights) + sum(jnp.sum(jnp.sin(a * weights[-1])) for a in jax.tree.leaves(v)), s
        return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, v0, params)

    ref = jax.jit(grads)(x, v0, params)
    mesh = mesh_lib.make_mesh("time=4,data=2")

    def split(x, v0, params):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            assert temporal.applies(x)
            return grads(x, v0, params)

    got = jax.jit(split)(jax.device_put(x, NamedSharding(mesh, P("time", "data"))), v0, params)
    assert 0 < float(jnp.mean(ref[0][1])) < 1
    np.testing.assert_array_equal(got[0][1], ref[0][1])
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-12)


def test_streaming_carries_every_state_variable():
    """``snnjax.deploy.Streamer`` over a CUBA-LIF layer (``v`` and ``c``), a half-threshold IF (fresh at
    ``v_threshold / 2``) and a leaky-integrator readout equals the multi-step forward step by step."""
    rngs = nnx.Rngs(1)
    net = Sequential(layers.linear(5, 8, rngs=rngs), CUBALIFNode(step_mode="m"), layers.linear(8, 6, rngs=rngs),
                     neurons.HalfThresholdIFNode(step_mode="m"), layers.linear(6, 3, rngs=rngs),
                     NonSpikingLIFNode())
    x = jnp.asarray(np.random.default_rng(6).uniform(0, 2, (6, 2, 5)))
    stream = Streamer(net)
    streamed = jnp.stack([stream(xt) for xt in x])
    np.testing.assert_allclose(streamed, net(x), rtol=1e-12, atol=1e-12)
