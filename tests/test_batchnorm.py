"""``batch_normalize`` (training-mode BatchNorm with a closed-form backward) equals autodiff of the formula.

float64, relative error <= 1e-12: the output and statistics, and the VJP for cotangents on all three outputs
(the statistics' cotangents are zero in training, where the module stops their gradient, but the rule
must still be right for them).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from snnjax.layers import BatchNorm
from snnjax.layers.batchnorm import batch_normalize

EPS = 1e-5


def _formula(x, scale, bias):
    axes = tuple(range(x.ndim - scale.ndim))
    mean = jnp.mean(x, axes)
    var = jnp.mean(jnp.square(x - mean), axes)
    return (x - mean) / jnp.sqrt(var + EPS) * scale + bias, mean, var


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


@pytest.mark.parametrize("shape, channels", [((3, 4, 5, 5, 6), (6,)), ((2, 5, 7, 3, 4), (3, 4)), ((9, 2), (2,))])
def test_value_and_vjp_match_autodiff(x64, shape, channels):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape) * 2 + 0.5)
    scale = jnp.asarray(rng.standard_normal(channels))
    bias = jnp.asarray(rng.standard_normal(channels))
    out, pull = jax.vjp(lambda *a: batch_normalize(*a, EPS), x, scale, bias)
    ref_out, ref_pull = jax.vjp(_formula, x, scale, bias)
    cts = tuple(jnp.asarray(rng.standard_normal(o.shape)) for o in ref_out)
    for a, b in zip((*out, *pull(cts)), (*ref_out, *ref_pull(cts)), strict=True):
        assert a.shape == b.shape and _rel(a, b) <= 1e-12
    # Training's case: only the output has a cotangent.
    zeros = (cts[0], jnp.zeros(channels), jnp.zeros(channels))
    for a, b in zip(pull(zeros), ref_pull(zeros), strict=True):
        assert _rel(a, b) <= 1e-12


def test_module_gradient_matches_autodiff_under_jit(x64):
    bn = BatchNorm(4, param_dtype=jnp.float64)
    bn.scale[...], bn.bias[...] = jnp.linspace(0.5, 2.0, 4), jnp.linspace(-1.0, 1.0, 4)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 3, 4, 4, 4)))
    c = jnp.cos(jnp.arange(x.size, dtype=jnp.float64)).reshape(x.shape)
    grads = nnx.jit(nnx.grad(lambda m, x: jnp.sum(m(x) * c), argnums=(0, 1)))(bn, x)
    ref = jax.grad(lambda x, s, b: jnp.sum(_formula(x, s, b)[0] * c), argnums=(0, 1, 2))(
        x, jnp.linspace(0.5, 2.0, 4), jnp.linspace(-1.0, 1.0, 4))
    for a, b in zip((grads[1], grads[0]["scale"][...], grads[0]["bias"][...]), ref, strict=True):
        assert _rel(a, b) <= 1e-12
