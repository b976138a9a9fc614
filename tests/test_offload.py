"""Optimizer state offloaded to pinned_host memory gives the same training trajectory."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from snnjax import parallel
from snnjax.models import create_model
from snnjax.train import offload
from snnjax.train.sharded import apply_plan
from snnjax.train.step import StepConfig, TrainState, split_model, train_step


def _trajectory(kind, steps=3):
    model = create_model("mlp", dict(in_features=12, hidden=(16,), num_classes=4), rngs=nnx.Rngs(0),
                         dtype=jnp.float64, param_dtype=jnp.float64)
    graphdef, params, rngs, rest = split_model(model)
    tx = optax.adam(1e-2)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=tx.init(params))
    shardings = offload.state_shardings(state, kind)
    if shardings is not None:
        state = jax.device_put(state, shardings)
    fn = offload.wrap_step(functools.partial(train_step, StepConfig(seed=0, time_steps=3, encoder=None), graphdef,
                                             tx), kind)
    step = jax.jit(fn, in_shardings=(shardings, None) if shardings else None,
                   out_shardings=(shardings, None) if shardings else None)
    batch = {"inputs": 3.0 * jax.random.uniform(jax.random.key(1), (3, 4, 12), jnp.float64),
             "labels": jnp.arange(4) % 4}
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, state


def test_offloaded_opt_state_same_trajectory(x64):
    assert offload.host_memory_kind() == "pinned_host"  # the CPU backend offers it (jax 0.10)
    losses0, state0 = _trajectory("none")
    losses1, state1 = _trajectory("opt_state")
    assert losses1 == losses0
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state0.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(state1.opt_state) if hasattr(x, "sharding")}
    assert kinds == {"pinned_host"}


def test_bad_offload_is_named():
    with pytest.raises(ValueError, match="offload must be one of"):
        offload.check("params")


def test_offload_under_a_sharded_plan_keeps_the_trajectory_and_the_layout(x64):
    def run(kind):
        model = create_model("mlp", dict(in_features=12, hidden=(16,), num_classes=4), rngs=nnx.Rngs(0),
                             dtype=jnp.float64, param_dtype=jnp.float64)
        graphdef, params, rngs, rest = split_model(model)
        tx = optax.adam(1e-2)
        p = parallel.plan(model, "data=2,fsdp=4", mode="fsdp")
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                           opt_state=tx.init(params))
        state, step = apply_plan(p, state, StepConfig(seed=0, time_steps=3, encoder=None), graphdef, tx,
                                 offload=kind)
        batch = {"inputs": 3.0 * jax.random.uniform(jax.random.key(1), (3, 8, 12), jnp.float64),
                 "labels": jnp.arange(8) % 4}
        losses = []
        for _ in range(3):
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
        return losses, state

    losses0, state0 = run("none")
    losses1, state1 = run("opt_state")
    assert losses1 == losses0
    for a, b in zip(jax.tree.leaves(state1.opt_state), jax.tree.leaves(state0.opt_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.memory_kind == "pinned_host" and b.sharding.memory_kind == "device"
        assert a.sharding.spec == b.sharding.spec  # fsdp keeps sharding the offloaded state
    assert not offload.saves_device_memory()  # the CPU's pinned_host is its own RAM
