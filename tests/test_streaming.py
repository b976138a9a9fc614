"""Streaming single-step inference equals the multi-step forward (float64): spikes identical, logits to 1e-12."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import deploy_model

from snnjax import Sequential, layers
from snnjax.deploy import streaming
from snnjax.deploy.graph import UnsupportedModelError, layer_ops
from snnjax.deploy.ops import initial_states, run_ops, step_ops
from snnjax.deploy.streaming import Streamer


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
    model, shape, scale = deploy_model(name)
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
    model, shape, _ = deploy_model("mlp")
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
