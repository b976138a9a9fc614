"""What only the Pallas kernels (``neurons.kernels.pallas``) have; ``test_neuron_impls.py`` runs them (interpret mode
on the CPU) through every check shared by the implementations.

- Without a GPU the kernels are lowered for CUDA (``lowering_platforms=("cuda",)``), which
  runs Pallas' Triton lowering rules on every kernel operation (compiling to PTX needs a
  GPU; ``python -m snnjax.bench.pallas_check`` does that on one).
- ``impl`` dispatch: float64 runs only in interpret mode; explicit ``pallas`` raises a ValueError that says why
  where it cannot run; bad ``KernelOptions`` are refused.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from helpers import AdaptiveLIF

from snnjax import neurons as F
from snnjax.neurons import modules as M
from snnjax.neurons import surrogate as sg
from snnjax.neurons.kernels import pallas as P

pytestmark = pytest.mark.usefixtures("x32_module")


@pytest.mark.parametrize("cfg, dtype, return_v_seq", [
    (F.NeuronConfig(kind="PLIF", v_threshold=1.2), jnp.bfloat16, True),
    (F.NeuronConfig(kind="LIF", decay_input=False, v_reset=None, v_threshold=0.8, surrogate=sg.SoftSign()),
     jnp.float32, False),
    (F.NeuronConfig(kind="IF", v_reset=None, surrogate=sg.PiecewiseQuadratic()), jnp.float16, False),
], ids=["PLIF-bfloat16-vseq", "LIF-float32", "IF-float16"])
def test_kernels_lower_for_gpu(cfg, dtype, return_v_seq):
    opts = P.KernelOptions(interpret=False)

    def grads(x, v, w):
        out, vjp = jax.vjp(functools.partial(P.multistep, cfg, return_v_seq=return_v_seq, options=opts), x, v, w)
        return vjp(jax.tree.map(jnp.ones_like, out))

    x = jax.ShapeDtypeStruct((6, 2, 1000), dtype)
    w = jax.ShapeDtypeStruct((), jnp.float32) if cfg.kind == "PLIF" else None
    hlo = jax.jit(grads).trace(x, jax.ShapeDtypeStruct((2, 1000), jnp.float32), w).lower(
        lowering_platforms=("cuda",)).as_text()
    assert hlo.count("custom_call @__gpu$xla.gpu.triton") == 2  # forward and backward kernels


def test_kernels_of_a_step_lower_for_gpu():
    """A user's neuron (two state variables, a learned parameter, a sigmoid) traced into the kernels: every
    operation of its step and of the step's VJP has a Triton lowering rule."""
    neuron, params = AdaptiveLIF()._step_neuron()
    opts = P.KernelOptions(interpret=False)

    def grads(x, params):
        out, vjp = jax.vjp(lambda x, p: P.multistep(neuron, x, None, p, return_v_seq=True, options=opts), x, params)
        return vjp(jax.tree.map(jnp.ones_like, out))

    hlo = jax.jit(grads).trace(jax.ShapeDtypeStruct((6, 2, 1000), jnp.float32), params).lower(
        lowering_platforms=("cuda",)).as_text()
    assert hlo.count("custom_call @__gpu$xla.gpu.triton") == 2  # forward and backward kernels


def test_float64_is_interpret_only(monkeypatch, x64):
    cfg = F.NeuronConfig()
    x = jnp.ones((3, 4), jnp.float64)
    assert F.resolve_impl("pallas", cfg, x) == "pallas"  # CPU: interpret mode takes float64
    assert P.unsupported_reason(cfg, x.shape, x.dtype, P.KernelOptions(interpret=False)) is not None
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert F.resolve_impl("auto", cfg, x) == "xla"
    with pytest.raises(ValueError, match=r"impl='pallas' cannot run.*float64.*interpret mode"):
        F.resolve_impl("pallas", cfg, x)


def test_explicit_pallas_errors_say_why():
    cfg = F.NeuronConfig()
    with pytest.raises(ValueError, match=r"impl must be one of .*'auto', 'xla', 'pallas'.*'triton'"):
        F.multistep(cfg, jnp.ones((3, 4)), impl="triton")
    with pytest.raises(ValueError, match=r"impl='pallas' cannot run.*floating point.*int32"):
        F.multistep(cfg, jnp.ones((3, 4), jnp.int32), impl="pallas")
    with pytest.raises(ValueError, match=r"impl='pallas' cannot run.*non-empty"):
        F.multistep(cfg, jnp.ones((0, 4)), impl="pallas")
    with pytest.raises(ValueError, match=r"cannot run this call.*non-empty"):
        P.multistep(cfg, jnp.ones((3, 0)))
    with pytest.raises(ValueError, match=r"PLIF.*\bw\b"):
        F.multistep(F.NeuronConfig(kind="PLIF"), jnp.ones((2, 3)), impl="pallas")
    with pytest.raises(ValueError, match=r"impl must be one of"):
        M.LIFNode(impl="fused")
    with pytest.raises(ValueError, match=r"power of two"):
        P.KernelOptions(block_m=100)
    with pytest.raises(ValueError, match=r"num_warps must be a power of two"):
        P.KernelOptions(num_warps=6)
