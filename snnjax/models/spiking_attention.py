"""SpikingJelly's spiking attention variants on tokens ``[T, N, L, D]`` (``layer.attention``).

* ``SpikeDrivenSelfAttention`` (Spike-Driven Transformer): per head, ``Q * SN(sum_L K * V)``, a
  membrane shortcut around it (the input passes a neuron first and is added back after the
  output projection's BatchNorm).
* ``QKAttention`` (QKFormer): ``token`` sums Q over each head's channels (a mask per token),
  ``channel`` over the tokens (a mask per channel); the mask's spikes gate K.
* ``SpikingSelfAttention`` (Spikformer's SSA, QKFormer's last stage): ``(V K^T) Q * 0.125`` per head.

Neurons (``snnjax.models.neuron_options``): with ``spiking_neuron=None`` each site is SpikingJelly's
attention LIF (``tau=2``, ``detach_reset``; the attention map's threshold 0.5) with the given keywords
over it; with a class, the class with the given keywords, as at every other site of the model.

Every projection is token-wise (torch's 1x1 Conv1d / Conv2d). Heads split ``D`` as ``(heads,
head_dim)`` in torch's channel order; tensor parallelism splits whole heads: the input
projections are column-parallel (kernels ``[D, (s,) heads, head_dim]``), the output projection
row-parallel (``[heads, head_dim, D]``), one all-reduce per attention.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax import layers
from snnjax.layers.residuals import Codec, compressed_apply
from snnjax.models.neuron_options import ATTENTION, ATTENTION_MAP, Neurons

# torch's default Conv / Linear weight init (kaiming_uniform_(a=sqrt(5))), as SpikingJelly leaves it.
TORCH_INIT = jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")


def _heads(dim: int, num_heads: int) -> tuple[int, int]:
    if dim % num_heads:
        raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
    return num_heads, dim // num_heads


class Projection(nnx.Module):
    """Token-wise ``Linear -> BatchNorm`` (torch: 1x1 conv + BatchNorm); ``din`` / ``dout`` int or tuple.

    ``axes`` names the kernel's dims; the BatchNorm takes the output dims' names.
    """

    def __init__(self, din, dout, *, use_bias: bool, axes, rngs: nnx.Rngs, dtype=None, param_dtype=None,
                 kernel_init=TORCH_INIT):
        kw = dict(use_bias=use_bias, kernel_init=kernel_init, rngs=rngs, dtype=dtype,
                  param_dtype=param_dtype, axes=axes)
        if isinstance(din, int) and isinstance(dout, int):
            self.fc = layers.linear(din, dout, **kw)
        else:
            self.fc = layers.linear_general(din, dout, **kw)
        n_in = 1 if isinstance(din, int) else len(din)
        self.bn = layers.BatchNorm(dout, dtype=dtype, param_dtype=param_dtype, axes=tuple(axes)[n_in:])

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.fc(x))


class SpikeDrivenSelfAttention(nnx.Module):
    """``x + BN(proj(Q * SN(sum_L K * V)))`` with ``Q, K, V = SN(BN(W SN(x)))`` on ``[T, N, L, D]``."""

    def __init__(self, dim: int, num_heads: int, neurons: Neurons, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=None):
        heads = _heads(dim, num_heads)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        col = ("embed", "heads", "head_dim")
        self.shortcut_lif = neurons.make(**ATTENTION)
        self.q, self.k, self.v = (Projection(dim, heads, use_bias=False, axes=col, **kw) for _ in range(3))
        self.q_lif, self.k_lif, self.v_lif = (neurons.make(**ATTENTION) for _ in range(3))
        self.attn_lif = neurons.make(**ATTENTION_MAP)
        self.proj = Projection(heads, dim, use_bias=True, axes=("heads", "head_dim", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.shortcut_lif(x)
        q, k, v = self.q_lif(self.q(s)), self.k_lif(self.k(s)), self.v_lif(self.v(s))  # [T, N, L, heads, hd]
        kv = self.attn_lif(jnp.sum(k * v, axis=2, keepdims=True))  # [T, N, 1, heads, hd]
        return self.proj(q * kv) + x


class QKAttention(nnx.Module):
    """``SN(BN(proj(SN(reduce Q) * K)))`` with ``Q, K = SN(BN(W x))`` on ``[T, N, L, D]``.

    ``qka_type``: ``token`` reduces Q over each head's channels, ``channel`` over the tokens.
    """

    def __init__(self, dim: int, num_heads: int, qka_type: str, neurons: Neurons, *, rngs: nnx.Rngs,
                 dtype=None, param_dtype=None):
        if qka_type not in ("token", "channel"):
            raise ValueError(f"qka_type must be 'token' or 'channel', got {qka_type!r}")
        heads = _heads(dim, num_heads)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.qka_type = qka_type
        self.qk = Projection(dim, (2, *heads), use_bias=False, axes=("embed", "qkv", "heads", "head_dim"), **kw)
        self.qk_lif = neurons.make(**ATTENTION)
        self.attn_lif = neurons.make(**ATTENTION_MAP)
        self.proj = Projection(heads, dim, use_bias=False, axes=("heads", "head_dim", "embed"), **kw)
        self.proj_lif = neurons.make(**ATTENTION)

    def __call__(self, x: jax.Array) -> jax.Array:
        qk = self.qk_lif(self.qk(x))  # [T, N, L, 2, heads, hd]
        q, k = qk[..., 0, :, :], qk[..., 1, :, :]
        axis = -1 if self.qka_type == "token" else 2
        mask = self.attn_lif(jnp.sum(q, axis=axis, keepdims=True))
        return self.proj_lif(self.proj(mask * k))


class SpikingSelfAttention(nnx.Module):
    """SSA: ``SN(BN(proj(SN((V K^T) Q * 0.125))))`` with ``Q, K, V = SN(BN(W x))`` on ``[T, N, L, D]``."""

    def __init__(self, dim: int, num_heads: int, neurons: Neurons, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=None, kernel_init=TORCH_INIT):
        heads = _heads(dim, num_heads)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, kernel_init=kernel_init)
        self.num_heads, self.scale = num_heads, 0.125
        self.qkv = Projection(dim, (3, *heads), use_bias=False, axes=("embed", "qkv", "heads", "head_dim"), **kw)
        self.qkv_lif = neurons.make(**ATTENTION)
        self.attn_lif = neurons.make(**ATTENTION_MAP)
        self.proj = Projection(heads, dim, use_bias=False, axes=("heads", "head_dim", "embed"), **kw)
        self.proj_lif = neurons.make(**ATTENTION)
        self.input_codec: Codec | None = None  # how the products keep the spikes q, k, v (snnjax.models.remat)

    def __call__(self, x: jax.Array) -> jax.Array:
        qkv = self.qkv_lif(self.qkv(x))  # [T, N, L, 3, heads, hd]
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        c = self.input_codec
        if c is None:
            y = _vkq(_vk(v, k), q)
        else:  # V K^T holds counts up to L (too many for int8): kept as it is
            y = compressed_apply(_vkq, (None, c), compressed_apply(_vk, (c, c), v, k), q)
        return self.proj_lif(self.proj(self.attn_lif(y * self.scale)))


def _vk(v, k):
    return jnp.einsum("...lhd,...lhe->...hde", v, k)


def _vkq(vk, q):
    return jnp.einsum("...hde,...lhe->...lhd", vk, q)
