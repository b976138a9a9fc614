"""``import snnjax`` changes no process-wide setting, and the library's compiled steps choose XLA:CPU's convolution
runtime per dtype (``conv_cpu.compiler_options``): Eigen for a float32 step, XLA's default (YNNPACK) for float64.
One fresh process (XLA reads ``XLA_FLAGS`` once, so only a process that has not imported snnjax shows what the
import changes); compiled only, never run."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROGRAM = """
import json, os
import jax
before = (dict(os.environ), dict(jax.config.values))
import snnjax
unchanged = before == (dict(os.environ), dict(jax.config.values))
import jax.numpy as jnp
import optax
from flax import nnx
from snnjax import layers
from snnjax.train import step as S
from snnjax.train.sharded import plan_step
jax.config.update("jax_enable_x64", True)

def ynn_convolutions(compiled):  # YNNPACK fusions made from a convolution (its op_name; not one that reads one)
    return sum("ynn_fusion" in line and 'conv_general_dilated"' in line for line in compiled.as_text().splitlines())

def library_step(dtype):
    # One 3x3 conv of 32 -> 32 channels: wide enough for XLA's default to hand it to YNNPACK.
    net = nnx.Sequential(layers.conv2d(32, 32, 3, padding=1, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=dtype),
                         lambda y: y.mean((2, 3)))
    graphdef, params, rngs, rest = S.split_model(net)
    tx = optax.sgd(0.1)
    state = S.TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                         opt_state=tx.init(params))
    cfg = S.StepConfig(seed=0, time_steps=2, encoder=None, compute_dtype=dtype)
    plan = snnjax.parallel.plan(net, 1, mode="dp")
    _, step = plan_step(plan, state, cfg, graphdef, tx, donate=False)
    batch = {"inputs": jnp.ones((2, 4, 8, 8, 32), dtype), "labels": jnp.zeros((4,), jnp.int32)}
    return ynn_convolutions(step.lower(state, batch).compile())

x, w = jnp.ones((4, 8, 8, 32), jnp.float32), jnp.ones((3, 3, 32, 32), jnp.float32)
conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
print(json.dumps({"unchanged": unchanged, "plain_float32": ynn_convolutions(jax.jit(conv).lower(x, w).compile()),
                  "float32": library_step(jnp.float32), "float64": library_step(jnp.float64)}))
"""


def test_import_sets_nothing_and_steps_choose_the_convolution_runtime_by_dtype():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["unchanged"]  # environment (XLA_FLAGS included) and jax.config as before the import
    assert got["plain_float32"] > 0  # XLA's default: plain jax.jit's float32 conv on YNNPACK
    # the library's float32 step on Eigen (no YNNPACK convolution), its float64 step on XLA's default
    assert got["float32"] == 0 and got["float64"] > 0
