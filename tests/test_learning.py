"""``snnjax.learning`` reproduces SpikingJelly 2.0.0's STDP beside gradient descent: the weights after each of 10
optimizer steps equal ``tests/fixtures/spikingjelly/stdp.npz`` (``make_stdp.py``) to 1e-12 in float64, for a linear
layer and the STDP tutorial's convolutional net, single- and multi-step, and for the reward-modulated learners."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import snnjax
from snnjax import layers, learning
from snnjax.layers.conv import Conv2d
from snnjax.neurons import IFNode, LIFNode, reset_net

pytestmark = pytest.mark.usefixtures("x64_module", "quick_compiles_module")
STEPS = 10


@pytest.fixture(scope="module")
def golden(reference_dir):
    with np.load(reference_dir / "stdp.npz") as f:
        return dict(f)


def clamp(w):
    return jnp.clip(w, -1.0, 1.0)


def kernel(torch_weight: np.ndarray) -> jax.Array:
    """A torch weight (``[out, in]`` / ``[O, I, kh, kw]``) as an snnjax kernel."""
    return jnp.asarray(torch_weight.T if torch_weight.ndim == 2 else torch_weight.transpose(2, 3, 1, 0))


def torch_layout(k: jax.Array) -> np.ndarray:
    k = np.asarray(k)
    return k.T if k.ndim == 2 else k.transpose(3, 2, 0, 1)


def assert_weights(golden, case, got: dict[int, list]):
    for i, ws in got.items():
        want = golden[f"{case}/weights/{i}.weight"]
        np.testing.assert_allclose(np.stack(ws), want, rtol=0, atol=1e-12, err_msg=f"{case} layer {i}")
        assert np.abs(want[-1] - golden[f"{case}/init/{i}.weight"]).max() > 1e-3  # the weights did move


F64 = dict(use_bias=False, rngs=nnx.Rngs(0), param_dtype=jnp.float64)


@pytest.mark.parametrize("mode", ["s", "m"])
def test_linear_stdp_matches_spikingjelly(golden, mode):
    """SpikingJelly's trace demo: one STDPLearner on ``Linear -> IF / LIF``, SGD on its on_grad update, clamp."""
    case = f"linear_{mode}"
    n_out, n_in = golden[f"{case}/init/0.weight"].shape
    node = IFNode(step_mode="s") if mode == "s" else LIFNode(tau=2.0, step_mode="m")
    net = snnjax.Sequential(layers.linear(n_in, n_out, **F64), node)
    net.layers[0].kernel.set_value(kernel(golden[f"{case}/init/0.weight"]))
    taus, f_post, scale = ((2.0, 2.0), clamp, 1.0) if mode == "s" else ((2.0, 4.0), lambda w: 1.0 - w, 0.5)
    learner = learning.STDPLearner(mode, net.layers[0], net.layers[1], tau_pre=taus[0], tau_post=taus[1],
                                   f_pre=clamp, f_post=f_post)
    optimizer = nnx.Optimizer(net, optax.sgd(0.01), wrt=nnx.Param)

    @nnx.jit
    def train_step(net, optimizer, learner, x):
        def loss_fn(net):
            with learning.record([learner]) as records:
                out = net(x)
            return jnp.sum(out) * 0.0, records  # no gradient of its own: the STDP change alone
        (_, records), grads = nnx.value_and_grad(loss_fn, has_aux=True)(net)
        grads = learning.on_grad(grads, net, learner, learner.step(records[0], scale=scale))
        optimizer.update(net, grads)
        net.layers[0].kernel.set_value(clamp(net.layers[0].kernel.get_value()))

    # single-step: the neuron's and the learner's states carry on from call to call, as in SpikingJelly; shaped
    # before the first call so that one program serves every step
    if mode == "s":
        node.v.set_value(jnp.zeros((2, n_out)))
        learner.trace_pre.set_value(jnp.zeros((2, n_in)))
        learner.trace_post.set_value(jnp.zeros((2, n_out)))
    x, got = jnp.asarray(golden[f"{case}/x"]), {0: []}
    for i in range(STEPS):
        train_step(net, optimizer, learner, x[i][None] if mode == "s" else x[i])  # [1, N, F]: one time step
        got[0].append(torch_layout(net.layers[0].kernel.get_value()))
        reset_net(net) if mode == "m" else None
    assert_weights(golden, case, got)


@pytest.mark.parametrize("mode", ["m", "s"])
def test_stdp_tutorial_matches_spikingjelly(golden, mode):
    """SpikingJelly's STDP tutorial, small: STDP on the convolutions, gradient descent (cross entropy of the time
    mean) on the linear layers, one optax optimizer with a learning rate per group."""
    case = f"conv_{mode}"
    net = snnjax.Sequential(
        layers.conv2d(2, 4, 3, padding=1, **F64), IFNode(step_mode=mode), layers.MaxPool2d(2),
        layers.conv2d(4, 4, 3, stride=2, padding=1, **F64), IFNode(step_mode=mode),
        layers.Flatten(), layers.linear(16, 8, **F64), IFNode(step_mode=mode),
        layers.linear(8, 10, **F64), IFNode(step_mode=mode))
    for i in (0, 3, 6, 8):
        net.layers[i].kernel.set_value(kernel(golden[f"{case}/init/{i}.weight"]))
    learners = [learning.STDPLearner(mode, net.layers[i], net.layers[i + 1], tau_pre=2.0, tau_post=100.0,
                                     f_pre=clamp, f_post=clamp) for i in (0, 3)]

    def group(params):  # layers 0 and 3 learn by STDP (SpikingJelly's optimizer_stdp), the rest by gradient
        return jax.tree_util.tree_map_with_path(lambda p, _: "stdp" if p[1].key in (0, 3) else "gd", params)

    tx = optax.multi_transform({"gd": optax.sgd(0.1), "stdp": optax.sgd(0.001)}, group)
    optimizer = nnx.Optimizer(net, tx, wrt=nnx.Param)

    @nnx.jit
    def train_step(net, optimizer, learners, x, y):
        def loss_fn(net):
            with learning.record(learners) as records:
                out = net(x) if mode == "m" else jnp.concatenate([net(x_t[None]) for x_t in x])
            return optax.softmax_cross_entropy_with_integer_labels(out.mean(0), y).mean(), records
        (_, records), grads = nnx.value_and_grad(loss_fn, has_aux=True)(net)
        for learner, rec in zip(learners, records, strict=True):  # the tutorial zeroes the STDP gradients first
            grads = learning.on_grad(grads, net, learner, learner.step(rec), replace=True)
        optimizer.update(net, grads)

    x = jnp.asarray(golden[f"{case}/x"].transpose(0, 1, 2, 4, 5, 3))  # [steps, T, N, H, W, C]
    y = jnp.asarray(golden[f"{case}/labels"])
    got = {i: [] for i in (0, 3, 6, 8)}
    for i in range(STEPS):
        train_step(net, optimizer, learners, x[i], y[i])
        for j in got:
            got[j].append(torch_layout(net.layers[j].kernel.get_value()))
        reset_net(net)
        for learner in learners:
            learner.reset()
    assert_weights(golden, case, got)


@pytest.mark.parametrize("kind", ["mstdp", "mstdpet"])
def test_reward_modulated_stdp_matches_spikingjelly(golden, kind):
    """MSTDP (a reward per example) and MSTDP-ET (unbatched spikes, a scalar reward), SGD on the change, clamp."""
    net = snnjax.Sequential(layers.linear(4, 3, **F64), IFNode(step_mode="s"))
    net.layers[0].kernel.set_value(kernel(golden[f"{kind}/init/0.weight"]))
    kwargs = dict(tau_pre=20.0, tau_post=10.0, f_pre=lambda w: (w + 1.0) ** 0.5, f_post=lambda w: (1.0 - w) ** 0.5)
    learner = (learning.MSTDPLearner("s", net.layers[0], net.layers[1], **kwargs) if kind == "mstdp" else
               learning.MSTDPETLearner("s", net.layers[0], net.layers[1], tau_trace=25.0, **kwargs))
    optimizer = nnx.Optimizer(net, optax.sgd(0.01), wrt=nnx.Param)

    @nnx.jit
    def train_step(net, optimizer, learner, x, reward):
        with learning.record([learner]) as records:
            net(x)
        grads = jax.tree.map(jnp.zeros_like, nnx.state(net, nnx.Param))
        grads = learning.on_grad(grads, net, learner, learner.step(records[0], reward))
        optimizer.update(net, grads)
        net.layers[0].kernel.set_value(clamp(net.layers[0].kernel.get_value()))

    x, reward = jnp.asarray(golden[f"{kind}/x"]), jnp.asarray(golden[f"{kind}/reward"])
    batch = x.shape[1:-1]
    node = net.layers[1]
    node.v.set_value(jnp.zeros((*batch, 3)))
    for name, shape in (("trace_pre", (*batch, 4)), ("trace_post", (*batch, 3)), ("eligibility", (*batch, 4, 3)),
                        ("trace_e", (4, 3))):
        if hasattr(learner, name):
            getattr(learner, name).set_value(jnp.zeros(shape))
    got = {0: []}
    for i in range(STEPS):
        train_step(net, optimizer, learner, x[i], reward[i])
        got[0].append(torch_layout(net.layers[0].kernel.get_value()))
    assert_weights(golden, kind, got)


def test_rules_refuse_bad_arguments_naming_them():
    pre, post, w = jnp.ones((2, 3, 3, 4)), jnp.ones((2, 3, 3, 5)), jnp.ones((1, 1, 4, 5))
    with pytest.raises(ValueError, match="tau_pre must be finite and >= 1"):
        learning.stdp_linear_step(pre[:, 0, 0], post[:, 0, 0], None, w[0, 0], tau_pre=0.5, tau_post=2.0)
    with pytest.raises(ValueError, match="tau_trace must be finite and > 0"):
        learning.mstdpet_reward_step(1.0, w, w, tau_trace=0.0)
    with pytest.raises(ValueError, match=r"maps \(3, 3\) to \(2, 2\)"):
        learning.stdp_conv2d_step(pre, post, None, w, stride=(2, 2), tau_pre=2.0, tau_post=2.0)
    with pytest.raises(ValueError, match=r"reset\(\) the learner"):
        learning.stdp_linear_step(pre[:, 0, 0], post[:, 0, 0], (pre[:1, 0, 0], post[:, 0, 0]), w[0, 0],
                                  tau_pre=2.0, tau_post=2.0)


def test_learner_refuses_what_spikingjelly_refuses():
    net = snnjax.Sequential(layers.linear(2, 2, rngs=nnx.Rngs(0)), IFNode(step_mode="m"))
    synapse, node = net.layers
    with pytest.raises(ValueError, match="step_mode"):
        learning.STDPLearner("x", synapse, node, tau_pre=2.0, tau_post=2.0)
    with pytest.raises(ValueError, match="step_mode"):
        learning.MSTDPLearner("m", synapse, node, tau_pre=2.0, tau_post=2.0)
    with pytest.raises(NotImplementedError, match="feature_group_count=1"):
        conv = Conv2d(2, 2, (1, 1), feature_group_count=2, rngs=nnx.Rngs(0))
        learning.STDPLearner("s", conv, node, tau_pre=2.0, tau_post=2.0)
    with pytest.raises(TypeError, match="kernel"):
        learning.STDPLearner("s", layers.MaxPool2d(2), node, tau_pre=2.0, tau_post=2.0)
    with pytest.raises(TypeError, match="snnjax.layers.linear / conv2d"):
        learning.STDPLearner("s", nnx.Linear(2, 2, rngs=nnx.Rngs(0)), node, tau_pre=2.0, tau_post=2.0)
    with pytest.raises(TypeError, match="sn must be a spiking neuron"):
        learning.STDPLearner("s", synapse, layers.MaxPool2d(2), tau_pre=2.0, tau_post=2.0)
    learner = learning.STDPLearner("m", synapse, node, tau_pre=2.0, tau_post=2.0)
    assert synapse.stdp_taps == ((learner.key, "pre"),) and node.stdp_taps == ((learner.key, "post"),)
    learner.close()  # record() no longer sees the layers
    assert not hasattr(synapse, "stdp_taps") and not hasattr(node, "stdp_taps")
