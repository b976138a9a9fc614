"""Temporal parallelism trains exactly like one device (float64, 8 host devices).

A small CIFAR10DVSVGG with T split over ``time=2``, ``time=4`` and ``time=2 x data=2 x tensor=2``,
and a tiny Spikformer (``helpers.layout_model``; the slowest to compile) over
``time=2 x data=2 x tensor=2``, trained 3 Adam steps, must give the single-device loss and gradients
of the first step and the parameters, optimizer state and BatchNorm statistics after three
(relative error <= 1e-9, compared by ``helpers.assert_same_training``). The spiking MLP also runs
with the TET loss (which mixes the per-step logits). Shared-over-time dropout masks must be those of
one device, and the compiled step must pass potentials between time shards (collective-permute)
without gathering T for the neurons.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import assert_same_training, gathered_dims, initial_state, layout_model, train_layout
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax import layers, parallel
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel.logical import activation_rules, constrain
from snnjax.train.step import StepConfig

LAYOUTS = ("time=2", "time=4", "time=2,data=2,tensor=2")


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module):
    yield
    _run.cache_clear()


@functools.cache
def _run(model_name: str, time_steps: int, spec: str | None, loss: str = "ce"):
    """``(first-step metrics with grads, state after 3 steps, step report)`` of one layout (None: ``data=1``, the
    mode the mesh implies)."""
    model, shape = layout_model(model_name)
    cfg = StepConfig(seed=0, time_steps=time_steps, encoder=None, compute_dtype=jnp.float64, return_grads=True,
                     loss=loss, tet_lambda=0.2 if loss == "tet" else 0.0)
    first, state, _, compiled, report = train_layout(initial_state(model, (time_steps, *shape[1:])), cfg,
                                                     spec or "data=1", report=True)
    report["gathered"] = gathered_dims(compiled.as_text())
    return first, state, report


def _assert_same_training(got, ref):
    (first, state, _), (ref_first, ref_state, _) = got, ref
    assert_same_training(first, state, ref_first, ref_state)


# Spikformer's attention and token layers under the time split with data x tensor; the time splits alone are VGG's.
@pytest.mark.parametrize("model_name,spec", [("vgg", spec) for spec in LAYOUTS] + [("spikformer", LAYOUTS[-1])])
def test_time_layout_matches_single_device(model_name, spec):
    t = 4
    got, ref = _run(model_name, t, spec), _run(model_name, t, None)
    _assert_same_training(got, ref)
    stats = got[2]["collectives"]
    assert stats["collective-permute"]["count"] > 0  # neuron potentials cross the time shards
    assert (0, t) not in got[2]["gathered"], got[2]["gathered"]  # no activation is gathered over T


def test_tet_loss_under_time_sharding():
    _assert_same_training(_run("mlp", 4, "time=4", "tet"), _run("mlp", 4, None, "tet"))


@pytest.mark.parametrize("share", [True, False])
def test_dropout_masks_under_time_sharding_equal_one_device(share):
    """Shared masks are one mask for every step on every time shard; per-step masks are the single device's."""
    mesh = mesh_lib.make_mesh("time=4,data=2")
    drop = layers.dropout(0.5, share_over_time=share)
    x = jnp.ones((8, 4, 32), jnp.float64)

    def apply(x):
        return drop(x, rngs=nnx.Rngs(dropout=3))

    def run(x):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), \
                activation_rules(mesh, parallel.get_strategy("dp").rules):
            return constrain(apply(constrain(x, ("time", "batch", None))), ("time", "batch", None))

    ref = jax.jit(apply)(x)
    got = jax.jit(run)(jax.device_put(x, NamedSharding(mesh, P("time", "data"))))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    assert 0 < float(jnp.mean(ref == 0)) < 1
    if share:
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(got[-1]))
