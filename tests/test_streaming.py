"""Streaming single-step inference equals the multi-step forward (float64): spikes identical, logits to 1e-12."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import gesture_sequential

from snnjax import Sequential, layers
from snnjax.deploy import streaming
from snnjax.deploy.graph import UnsupportedModelError, layer_ops
from snnjax.deploy.ops import initial_states, run_ops, step_ops
from snnjax.deploy.streaming import Streamer
from snnjax.models import CIFAR10DVSVGG, SpikingMLP
from snnjax.neurons import LIFNode

F64 = {"dtype": jnp.float64, "param_dtype": jnp.float64}


def randomize_batch_norm(model, seed=0):
    """Running statistics and affine parameters away from (0, 1), so eval-mode BatchNorm is not the identity,
    with a positive shift that keeps every layer firing."""
    for i, (_, m) in enumerate(nnx.iter_modules(model)):
        if hasattr(m, "mean") and isinstance(m.mean, nnx.BatchStat):
            rng = np.random.default_rng(seed + i)
            m.mean[...] = jnp.asarray(0.2 * rng.normal(size=m.mean.shape))
            m.var[...] = jnp.asarray(rng.uniform(0.5, 1.5, m.var.shape))
            m.scale[...] = jnp.asarray(rng.uniform(1.0, 2.0, m.scale.shape))
            m.bias[...] = jnp.asarray(rng.uniform(0.3, 0.9, m.bias.shape))


def build(name):
    """``(model, input shape [T, N, ...], input scale)`` of a small float64 model whose every layer fires."""
    if name == "mlp":
        return SpikingMLP(16, (48, 32), 5, tau=1.5, rngs=nnx.Rngs(0), **F64), (6, 3, 4, 4, 1), 4.0
    if name == "vgg":
        vgg = CIFAR10DVSVGG(widths=(8, 16, 16, 16), pools=(False, True, False, True), image_size=16, num_classes=4,
                            rngs=nnx.Rngs(1), **F64)
        randomize_batch_norm(vgg)
        return vgg, (5, 2, 16, 16, 2), 2.0
    if name == "user":  # built by hand, not from specs; flattens in torch's order (layers.Flatten's default)
        rngs = nnx.Rngs(3)
        net = Sequential(layers.conv2d(2, 6, 3, padding=1, rngs=rngs, **F64), layers.BatchNorm(6, **F64),
                         LIFNode(tau=2.0, step_mode="m"), layers.AvgPool2d(2), layers.Flatten(),
                         layers.dropout(0.5), layers.linear(6 * 4 * 4, 3, rngs=rngs, **F64))
        randomize_batch_norm(net)
        return net, (4, 2, 8, 8, 2), 3.0
    net = gesture_sequential((16, 16, 2), channels=8, num_classes=3, blocks=2, hidden=16, pool="max",
                             rngs=nnx.Rngs(2), **F64)
    randomize_batch_norm(net)
    net.layers[10].kernel[...] = 4.0 * np.asarray(net.layers[10].kernel[...])  # the hidden layer: drive to fire
    return net, (4, 2, 16, 16, 2), 3.0


@jax.jit
def _spikes(model, x):
    """Each neuron layer's spikes ``[T, N, ...]`` from the multi-step ops and from T single steps, and the logits."""
    ops = layer_ops(model)
    multi, steps = [], []
    logits = run_ops(ops, x, record=lambda op, _, y: multi.append(y) if op.kind == "neuron" else None)
    states = initial_states(ops, jax.ShapeDtypeStruct(x.shape[1:], x.dtype))
    for t in range(x.shape[0]):
        steps.append([])
        _, states = step_ops(ops, x[t], states,
                             record=lambda op, _, y, seen=steps[-1]: seen.append(y) if op.kind == "neuron" else 0)
    return multi, [jnp.stack([s[i] for s in steps]) for i in range(len(multi))], logits, model(x)


@pytest.mark.parametrize("name", ["mlp", "vgg", "dvs_gesture", "user"])
def test_streaming_equals_the_multi_step_forward(x64, name):
    model, shape, scale = build(name)
    model.eval()
    x = scale * jax.random.uniform(jax.random.key(3), shape, jnp.float64)
    multi_spikes, step_spikes, logits, direct = _spikes(model, x)
    np.testing.assert_array_equal(logits, direct)  # the op chain is the model's own forward
    for layer, spikes in enumerate(multi_spikes):
        assert 0 < float(spikes.mean()) < 1, f"layer {layer} fires {float(spikes.mean())}: the check would be void"
        np.testing.assert_array_equal(spikes, step_spikes[layer])
    assert float(jnp.abs(logits).max()) > 0.1

    stream = Streamer(model)
    streamed = jnp.stack([stream(x[t]) for t in range(shape[0])])
    np.testing.assert_allclose(streamed, logits, rtol=0, atol=1e-12)
    assert stream.states is not None and len(stream.states) == len(multi_spikes)
    stream.reset()  # a new sequence starts from the fresh state: the same logits again
    np.testing.assert_allclose(stream(x[0]), logits[0], rtol=0, atol=1e-12)


def test_streaming_compiles_once_per_input_shape(x64):
    model, shape, _ = build("mlp")
    stream = Streamer(model)
    x = jnp.ones((shape[0], 7, *shape[2:]), jnp.float64)  # a batch size no other test compiles
    before = streaming._jitted_step._cache_size()
    for _ in range(2):
        stream.reset()
        for t in range(shape[0]):
            stream(x[t])
    assert streaming._jitted_step._cache_size() == before + 1


def test_models_that_are_not_an_op_chain_are_refused():
    """Spikformer (attention, residuals) is refused like any module the op description does not know."""
    with pytest.raises(UnsupportedModelError, match="Linear is not a chain"):
        Streamer(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
    with pytest.raises(UnsupportedModelError, match=r"layers.1 is a MaxPool2d.*stride = window, no padding"):
        Streamer(Sequential(layers.Flatten(), layers.MaxPool2d(3, stride=2)))
