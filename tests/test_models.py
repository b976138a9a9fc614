"""Model shapes, presets, dtypes and configuration errors."""
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from snnjax.models import CIFAR10DVSVGG, Spikformer, SpikingMLP, spikformer_s, spikformer_ti


def n_params(model):
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_vgg_default_is_spikingjelly_architecture():
    model = nnx.eval_shape(lambda: CIFAR10DVSVGG(rngs=nnx.Rngs(0)))
    assert [b.conv.kernel.shape[-1] for b in model.features] == [64, 128, 256, 256, 512, 512, 512, 512]
    assert [b.pool for b in model.features] == [False, False, True, False, True, False, True, False]
    assert model.classifier.kernel.shape == (512 * 3 * 3, 10)
    assert n_params(model) == pytest.approx(9.23e6, rel=0.01)
    cfg = model.features[0].neuron.config
    assert (cfg.tau, cfg.decay_input, cfg.detach_reset, type(cfg.surrogate).__name__) == (1.333, False, True, "ATan")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_small_vgg_forward_and_grad(dtype):
    model = CIFAR10DVSVGG(widths=[4, 4, 8, 8, 8, 8, 8, 8], dropout=0.25, rngs=nnx.Rngs(0), dtype=dtype)
    x = (jax.random.uniform(jax.random.key(1), (3, 2, 48, 48, 2)) < 0.3).astype(jnp.float32)
    logits = nnx.jit(lambda m, x: m(x))(model, x)
    assert logits.shape == (3, 2, 10) and logits.dtype == dtype
    grads = nnx.jit(nnx.grad(lambda m: m(x).astype(jnp.float32).mean()))(model)
    assert all(jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads))


def test_spikformer_presets_and_shapes():
    ti = nnx.eval_shape(lambda: spikformer_ti(rngs=nnx.Rngs(0)))
    assert ti.head.kernel.shape == (256, 1000) and len(ti.blocks) == 4 and ti.blocks[0].attn.num_heads == 8
    s = nnx.eval_shape(lambda: spikformer_s(rngs=nnx.Rngs(0)))
    assert s.head.kernel.shape == (384, 1000) and len(s.blocks) == 6 and s.blocks[0].attn.num_heads == 12
    model = Spikformer(T=2, img_size_h=32,
                       img_size_w=32, num_classes=10, embed_dims=32, num_heads=4, depths=1, rngs=nnx.Rngs(0))
    assert model.blocks[0].attn.attn_lif.v_threshold == 0.5
    image = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
    forward = nnx.jit(lambda m, x: m(x))
    assert forward(model, image).shape == (2, 2, 10)  # static image repeated T times
    assert forward(model, jnp.stack([image, image])).shape == (2, 2, 10)


def test_spikformer_rejects_bad_sizes():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        Spikformer(embed_dims=32, num_heads=3, depths=1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="patch_size must be 4 or 16"):
        Spikformer(patch_size=8, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("neuron", ["IF", "LIF", "PLIF"])
def test_mlp_trains_a_step(neuron):
    model = SpikingMLP(64, (32,), 10, spiking_neuron=neuron, batch_norm=True, rngs=nnx.Rngs(0))
    x = jax.random.uniform(jax.random.key(0), (4, 8, 8, 8, 1)) * 3
    labels = jnp.arange(8) % 10

    def loss(m):
        logits = m(x).mean(0)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    grads = nnx.jit(nnx.grad(loss))(model)
    assert float(jnp.abs(grads["fcs"][0]["kernel"][...]).sum()) > 0  # surrogate gradients reach the first layer
    with pytest.raises(ValueError, match="spiking_neuron='Izhikevich' is not a neuron name"):
        SpikingMLP(4, (4,), 2, spiking_neuron="Izhikevich", rngs=nnx.Rngs(0))
