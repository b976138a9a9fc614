"""``import snnjax`` makes plain ``jax.jit`` compile convolutions as the library's steps do (the same program as
with ``conv_cpu.compiler_options``), unless the user set the option or JAX started first. Each case runs in a fresh
process: XLA reads ``XLA_FLAGS`` once."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROGRAM = """
import json, sys
if sys.argv[1] == "jax_first":
    import jax
    jax.devices()
import snnjax, jax, jax.numpy as jnp
from snnjax.layers.conv_cpu import compiler_options
if sys.argv[1] == "jax_first":
    print(json.dumps({"set": snnjax.CPU_CONV_DEFAULT}))
    sys.exit()

def loss(x, w):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sum(y ** 2)

grad = jax.grad(loss, argnums=(0, 1))
x, w = jnp.ones((8, 16, 16, 32)), jnp.ones((3, 3, 32, 32))
plain = jax.jit(grad).lower(x, w).compile().as_text()
opts = jax.jit(grad, compiler_options=compiler_options()).lower(x, w).compile().as_text()
print(json.dumps({"set": snnjax.CPU_CONV_DEFAULT, "same": plain == opts, "plain_ynn": "ynn" in plain.lower()}))
"""


def run(case: str, xla_flags: str = "") -> dict:
    env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROGRAM, case], capture_output=True, text=True, env=env, timeout=300,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_plain_jit_compiles_convolutions_as_the_library_does():
    assert run("snnjax_first") == {"set": True, "same": True, "plain_ynn": False}


def test_the_users_setting_wins():
    mine = ("--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,"
            "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION,LIBRARY_FUSION_TYPE_REDUCE")
    assert run("snnjax_first", mine) == {"set": False, "same": False, "plain_ynn": True}


def test_nothing_is_set_once_jax_has_started():
    assert run("jax_first")["set"] is False
