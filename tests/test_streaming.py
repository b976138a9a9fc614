"""Streaming single-step inference (the model's own layers, neurons in single-step mode) equals the multi-step
forward (float64): spikes identical, logits to 1e-12."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import deploy_model

from snnjax import Sequential, layers
from snnjax.deploy import streaming
from snnjax.deploy.calls import UnsupportedModelError, neurons
from snnjax.deploy.streaming import Streamer, initial_states, step
from snnjax.neurons import LIFNode
from snnjax.neurons.modules import observe


def _observed(model, run):
    """``run()``'s result and each neuron's spikes (``neurons(model)`` order), seen through ``observe``."""
    seen = {}
    with observe(lambda node, spikes, _: seen.setdefault(id(node), []).append(spikes)):
        out = run()
    return out, [seen[id(node)][0] for _, node in neurons(model)]


@jax.jit
def _spikes(model, x):
    """Each neuron's spikes ``[T, N, ...]`` from the multi-step forward and from T single steps, and the logits."""
    logits, multi = _observed(model, lambda: model(x))
    states = initial_states(model, jax.ShapeDtypeStruct(x.shape[1:], x.dtype))
    steps = []
    for t in range(x.shape[0]):
        (_, states), spikes = _observed(model, lambda t=t, states=states: step(model, x[t], states))
        steps.append(spikes)  # each [1, N, ...]: the step's sequence of one
    return multi, [jnp.concatenate([s[i] for s in steps]) for i in range(len(multi))], logits


@pytest.mark.parametrize("name", ["mlp", "vgg", "dvs_gesture", "user", "spikformer"])
def test_streaming_equals_the_multi_step_forward(x64, name):
    model, shape, scale = deploy_model(name)
    model.eval()
    x = scale * jax.random.uniform(jax.random.key(3), shape, jnp.float64)
    multi_spikes, step_spikes, logits = _spikes(model, x)
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


class _TimeMean(nnx.Module):
    def __call__(self, x):
        return x.mean(0)


def test_models_whose_state_cannot_be_carried_are_refused(x64):
    """No neuron (nothing to carry), a neuron called twice per step (one state each), an output without time."""
    with pytest.raises(UnsupportedModelError, match="Linear has no spiking neuron"):
        Streamer(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
    rngs, lif, x = nnx.Rngs(0), LIFNode(step_mode="m"), jnp.ones((3, 2), jnp.float64)
    shared = Sequential(layers.linear(2, 2, rngs=rngs), lif, layers.linear(2, 2, rngs=rngs), lif)
    with pytest.raises(UnsupportedModelError, match="neuron layers.1 is called 2 times per time step"):
        Streamer(shared)(x)
    averaged = Sequential(layers.linear(2, 2, rngs=rngs), LIFNode(step_mode="m"), _TimeMean())
    with pytest.raises(UnsupportedModelError, match=r"maps \[T=4, ...\] inputs to \(3, 2\): its output has no time"):
        Streamer(averaged)(x)
