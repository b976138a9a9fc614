"""Offloaded optimizer state and parameters (pinned_host memory) give the same training trajectory."""
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from snnjax import parallel
from snnjax.models import create_model
from snnjax.parallel import param_stream
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train import config as config_lib
from snnjax.train import offload, train_and_evaluate, validate
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
        offload.check("disk")
    with pytest.raises(ValueError, match="use snnjax.train.apply_plan"):  # streaming needs a plan's step
        offload.state_shardings(None, "params")


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


# -- parameters in host memory, fetched per unit (offload=params|all) --------------------------------------------

def _mlp():
    return create_model("mlp", dict(in_features=12, hidden=(16, 16), num_classes=4), rngs=nnx.Rngs(0),
                        dtype=jnp.float64, param_dtype=jnp.float64)


def _planned_run(mesh, mode, kind, steps=3):
    model = _mlp()
    graphdef, params, rngs, rest = split_model(model)
    tx = optax.adam(1e-2)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=tx.init(params))
    state, step = apply_plan(parallel.plan(model, mesh, mode=mode), state,
                             StepConfig(seed=0, time_steps=3, encoder=None), graphdef, tx, offload=kind)
    batch = {"inputs": 3.0 * jax.random.uniform(jax.random.key(1), (3, 8, 12), jnp.float64),
             "labels": jnp.arange(8) % 4}
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, state, step, batch


@functools.cache
def _plain_run(mesh, mode):
    """The run without offload (shared by the tests that compare against it): losses, parameters, their specs."""
    losses, state, _, _ = _planned_run(mesh, mode, "none")
    return losses, [(np.asarray(x), x.sharding) for x in jax.tree.leaves(state.params)]


@pytest.mark.parametrize("mesh, mode, kind", [("fsdp=8", "fsdp", "params"), ("fsdp=8", "fsdp", "all"),
                                              ("data=2,tensor=4", "dp_tp", "params")])
def test_offloaded_params_keep_the_trajectory_and_the_partitioning(x64, mesh, mode, kind):
    losses0, params0 = _plain_run(mesh, mode)
    losses1, state1, _, _ = _planned_run(mesh, mode, kind)
    np.testing.assert_allclose(losses1, losses0, rtol=0, atol=1e-12)
    for a, (b, b_sharding) in zip(jax.tree.leaves(state1.params), params0, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=1e-12)
        assert a.sharding.memory_kind == "pinned_host" and b_sharding.memory_kind == "device"
        assert a.sharding.spec == b_sharding.spec  # only the memory kind changes
    opt_kinds = {x.sharding.memory_kind for x in jax.tree.leaves(state1.opt_state)}
    assert opt_kinds == ({"pinned_host"} if kind == "all" else {"device"})


def test_each_unit_fetches_its_parameters_inside_the_step(x64):
    """The step lowered for a GPU (the CPU lowers in-step transfers to nothing) moves each unit's parameters from
    host memory when the unit runs, once per parameter, and writes each gradient back once."""
    _, state, step, batch = _planned_run("fsdp=8", "fsdp", "params", steps=1)
    text = step.trace(state, batch).lower(lowering_platforms=("cuda",)).as_text(debug_info=True)
    counts = param_stream.transfers(text)
    model = _mlp()
    owned = {u.name: sum(1 for path, _ in parallel.variables.flat_vars(nnx.state(model, nnx.Param))
                         if any(path.startswith(p + ".") for p in u.owns)) for u in model.units()}
    assert owned == {"layers.0": 2, "layers.1": 2, "head": 2}  # kernel and bias each
    for unit, n in owned.items():
        assert counts[(unit, "forward", "to_device")] == n
        assert counts[(unit, "backward", "to_host")] == n  # the gradients, back to host memory
    # The backward fetches again the kernels it multiplies by (not the first layer's: its input needs no gradient)
    assert counts.get(("layers.0", "backward", "to_device"), 0) == 0
    assert counts[("layers.1", "backward", "to_device")] == counts[("head", "backward", "to_device")] == 1
    assert sum(counts.values()) == 3 * 2 + 3 * 2 + 2
    # The compiled (CPU) step takes and returns the six parameters in host memory (memory space S(5))
    entry = step.lower(state, batch).compile().as_text().split("entry_computation_layout={")[1].split("\n")[0]
    args, outs = entry.split(")->(")
    assert args.count("S(5)") == outs.count("S(5)") == 6
    p = parallel.plan(model, "fsdp=8", mode="fsdp").with_offload("all")
    assert "offload=all: parameters (" in str(p) and "each unit's are fetched to the device" in str(p)
    assert "optimizer state (" in str(p) and p.as_dict()["offload"] == "all"


def test_the_pipeline_refuses_offloaded_params():
    model = _mlp()
    p = parallel.plan(model, "stage=2,data=4", mode="pp", global_batch_size=8,
                      pipeline=PipelineOptions(layout="2|1", microbatches=2))
    with pytest.raises(ValueError, match="packed in one row"):
        p.with_offload("params")
    assert p.with_offload("opt_state").offload == "opt_state"
    c = _digits_config()
    c.parallel.mode, c.parallel.mesh, c.parallel.offload = "pp", "stage=2,data=4", "all"
    with pytest.raises(ValueError, match="config.parallel.offload='all' streams"):
        validate(c)


def _digits_config():
    c = config_lib.load(pathlib.Path(__file__).resolve().parents[1] / "configs" / "digits.py")
    c.model.hidden, c.global_batch_size, c.data.time_steps, c.dtype = (32,), 16, 2, "float64"
    c.parallel.mode, c.parallel.mesh, c.log_every_steps, c.checkpoint_every_steps = "fsdp", "fsdp=8", 1, 2
    c.schedule = "constant"  # the same learning rates in a 2-step run and a 4-step one
    return c


def _losses(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in rows if "train_loss" in r]


def test_resume_across_an_offloaded_checkpoint_equals_the_plain_run(tmp_path, x64):
    plain = _digits_config()
    plain.num_steps = 4
    train_and_evaluate(plain, tmp_path / "plain")
    first = _digits_config()
    first.num_steps, first.parallel.offload = 2, "all"
    train_and_evaluate(first, tmp_path / "offloaded")
    rest = _digits_config()
    rest.num_steps, rest.parallel.offload, rest.resume = 4, "params", True
    summary = train_and_evaluate(rest, tmp_path / "offloaded")
    np.testing.assert_allclose(_losses(tmp_path / "offloaded"), _losses(tmp_path / "plain"), rtol=0, atol=1e-12)
    assert summary["eval_loss"] == pytest.approx(json.loads((tmp_path / "plain" / "summary.json").read_text())[
        "eval_loss"], abs=1e-12)
