"""The zero-bubble backward split: B (input gradients) + W (weight gradients) equals the whole VJP, and W holds
only the weight-gradient contractions, under every checkpointing policy (their contractions sit in ``remat``
bodies, which the split inlines)."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from snnjax.layers import conv_cpu
from snnjax.models import CIFAR10DVSVGG, Spikformer, remat
from snnjax.parallel import weight_split

MIX = {"features.0": "units", "features.1": "spikes", "features.2": "dots_saveable"}
POLICIES = {"none": "none", "units": "units", "spikes": "spikes", "dots_saveable": "dots_saveable", "mix": MIX}


def _backward(units: int, with_input_grad: bool, policy="none", spike_residuals="float", spikformer=False,
              abstract=False):
    """The VJP of the first ``units`` units of a small CIFAR10DVSVGG (or Spikformer) under ``policy``, as
    ``(jaxpr, residuals, cotangent, is_param, number of parameters)``; ``abstract``: residuals and cotangent as
    shapes (traced only, nothing run)."""
    if spikformer:
        model = Spikformer(T=2, img_size_h=16,
                           img_size_w=16, in_channels=2, num_classes=10, embed_dims=16, num_heads=2, depths=2,
                           mlp_ratio=2, rngs=nnx.Rngs(0))
        shape = (2, 2, 16, 16, 2)
    else:
        model, shape = CIFAR10DVSVGG(widths=(4, 8, 8, 8, 8, 8, 8, 8), rngs=nnx.Rngs(0)), (3, 2, 48, 48, 2)
    remat.configure(model, remat=policy, spike_residuals=spike_residuals)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    x = (jax.random.uniform(jax.random.key(1), shape) < 0.4).astype(jnp.result_type(float))

    def forward(p, x):
        m = nnx.merge(graphdef, p, jax.tree.map(lambda a: a, rest))
        for unit in m.units()[:units]:
            x = unit(x)
        return x

    found = {}

    def vjp_leaves(params, x):
        if with_input_grad:
            y, vjp = jax.vjp(forward, params, x)
        else:
            y, vjp = jax.vjp(lambda p: forward(p, x), params)
        leaves, found["treedef"] = jax.tree.flatten(vjp)
        param_ids = {id(v) for v in jax.tree.leaves(params)}
        found["is_param"] = [id(v) in param_ids for v in leaves]
        return leaves, y

    # A pipeline spans two or more devices, where the convolutions are XLA's (conv_cpu.sparse_refusal); traced
    # here on one, the sparse-input kernels are turned off to match.
    with conv_cpu.sparse_inputs(False):
        leaves, y = (jax.eval_shape if abstract else lambda f, *a: f(*a))(vjp_leaves, params, x)
        ct = y if abstract else jax.random.normal(jax.random.key(2), y.shape, y.dtype)
        closed = jax.make_jaxpr(lambda lv, c: jax.tree.leaves(jax.tree.unflatten(found["treedef"], lv)(c)))(leaves,
                                                                                                             ct)
    return closed, leaves, ct, found["is_param"], len(jax.tree.leaves(params))


def _contractions(jaxpr) -> int:
    return sum(e.primitive.name in weight_split.HEAVY for e in jaxpr.eqns)


def _large_bytes(avals) -> int:
    """Bytes of the arrays larger than ``weight_split.SMALL_BYTES`` (scalars and bias-sized vectors aside)."""
    sizes = (int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in avals)
    return sum(n for n in sizes if n > weight_split.SMALL_BYTES)


@pytest.mark.parametrize("policy,with_input_grad", [(p, True) for p in POLICIES] + [("none", False),
                                                                                    ("units", False)])
def test_b_then_w_equals_the_whole_backward(policy, with_input_grad):
    with jax.enable_x64():
        closed, leaves, ct, is_param, n_params = _backward(3, with_input_grad, POLICIES[policy])
        bw = weight_split.split(closed, n_params, is_param + [False])
        input_grads, stored = bw.run_b(*leaves, ct)
        weight_grads = bw.run_w(stored, [leaves[i] for i in bw.direct_inputs])
        want = jax.tree.leaves(jax.tree.unflatten(jax.tree.structure(closed.out_avals), list(
            jax.extend.core.jaxpr_as_fun(closed)(*leaves, ct))))
        got = weight_grads + input_grads
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # The parameters are taken again at W, not stored; no stored array is a parameter.
        assert all(is_param[i] for i in bw.direct_inputs)


@pytest.mark.parametrize("with_input_grad", [True, False])
def test_w_runs_one_contraction_per_conv_and_stores_less_than_the_residuals(with_input_grad):
    closed, leaves, ct, is_param, n_params = _backward(3, with_input_grad, abstract=True)
    bw = weight_split.split(closed, n_params, is_param + [False])
    convs = 3  # three conv blocks in the first three units
    assert _contractions(bw.w.jaxpr) == convs  # one weight-gradient conv per layer; the chain stays in B
    assert _contractions(bw.b.jaxpr) == (convs if with_input_grad else convs - 1)  # the input-gradient convs
    assert collections.Counter(e.primitive.name for e in bw.w.jaxpr.eqns)["conv_general_dilated"] == convs
    nbytes = lambda avals: sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in avals)  # noqa: E731
    residuals = nbytes([leaf for leaf, p in zip(leaves, is_param, strict=True) if not p])
    assert nbytes(bw.stored) < 0.75 * residuals


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "none"])
@pytest.mark.parametrize("spike_residuals", ["float", "bits"])
def test_checkpointing_leaves_w_as_without_it(policy, spike_residuals):
    """Under checkpointing the contractions sit in ``remat`` bodies: inlined, W runs the same weight-gradient
    contractions as under ``none`` and stores the same arrays (each layer's input, encoded as the spike residual
    setting says, and output cotangent); B recomputes the checkpointed forwards."""
    ref = _backward(3, True, "none", spike_residuals, abstract=True)
    ref_bw = weight_split.split(ref[0], ref[4], ref[3] + [False])
    closed, _, _, is_param, n_params = _backward(3, True, POLICIES[policy], spike_residuals, abstract=True)
    assert _contractions(closed.jaxpr) == 0  # every contraction is nested: the old top-level split found none
    bw = weight_split.split(closed, n_params, is_param + [False])
    assert _contractions(bw.w.jaxpr) == _contractions(ref_bw.w.jaxpr) == 3
    recomputed = _contractions(bw.b.jaxpr) - _contractions(ref_bw.b.jaxpr)  # forward convolutions run again in B
    assert recomputed == 3 if policy in ("units", "spikes") else recomputed >= 0
    assert _large_bytes(bw.stored) == _large_bytes(ref_bw.stored)


def test_attention_contractions_reach_w_under_each_policy():
    """Spikformer's attention products (both operands activations) stay in B's cotangent chain; its projections'
    weight gradients reach W under every policy, as many as under ``none``, storing the same bytes."""
    def split(policy):  # every unit but the head
        closed, _, _, is_param, n_params = _backward(7, True, policy, "bits", spikformer=True, abstract=True)
        return weight_split.split(closed, n_params, is_param + [False])

    ref = split("none")
    assert _contractions(ref.w.jaxpr) > 0
    for policy in ("units", "spikes", "dots_saveable"):
        bw = split(policy)
        assert _contractions(bw.w.jaxpr) == _contractions(ref.w.jaxpr), policy
        assert _large_bytes(bw.stored) == _large_bytes(ref.stored), policy
