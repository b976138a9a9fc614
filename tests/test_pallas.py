"""The fused Pallas neuron kernels (``snnjax.pallas``, interpret mode on the CPU) against the XLA path.

- The reference checker with ``--impl pallas`` passes every SpikingJelly case of
  ``../shared/reference/neurons.npz``. It runs as a subprocess started when this module
  begins and is read by its last test, so its compiles overlap the other tests (the CI
  machine has 2 cores).
- Hypothesis, in float64 or float32: random neuron configurations (IF / LIF / PLIF, tau,
  decay_input, threshold, hard or soft reset, detach_reset, every surrogate with a random
  alpha), random T, trailing shapes and block sizes (so M is mostly not a multiple of the
  block and the grid has several blocks, the last one's rows masked), random time chunks
  (several, a partial last one, or one for all T), random or default ``v_init``, both
  output forms.
  Spikes must equal the XLA path's exactly; V and the gradients w.r.t. ``x_seq``,
  ``v_init`` and PLIF's ``w`` agree to 1e-10 normwise relative error in float64 (1e-5 in
  float32).
- With x64 off, float32 and bfloat16 inputs (float32 state) over configurations that
  together use every kind, reset mode and surrogate: spikes and V equal the XLA path's
  exactly, gradients agree to float32 rounding, output dtypes are the XLA path's.
- Without a GPU the kernels are lowered for CUDA (``lowering_platforms=("cuda",)``), which
  runs Pallas' Triton lowering rules on every kernel operation (compiling to PTX needs a
  GPU; ``python -m snnjax.pallas.check`` does that on one).
- ``impl`` dispatch: ``auto`` is XLA under a multi-device layout, Pallas on one GPU;
  explicit ``pallas`` raises a ValueError that says why where it cannot run; the
  modules store ``impl`` and pass it through.
"""
from __future__ import annotations

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snnjax import pallas as P
from snnjax.neurons import functional as F
from snnjax.neurons import modules as M
from snnjax.neurons import surrogate as sg
from snnjax.pallas.check import rel_error, run_vjp
from snnjax.parallel import logical
from strategies import NEURON_CONFIGS, problem_arrays

pytestmark = pytest.mark.usefixtures("x32_module")  # the float64 property test turns x64 on for itself
RTOL = {"float64": 1e-10, "float32": 1e-5}


REFERENCE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "reference" / "neurons.npz"


@pytest.fixture(scope="module", autouse=True)
def pallas_cli():
    """``python -m snnjax.interop.spikingjelly check neurons.npz --impl pallas``, started now, read at the end."""
    if not REFERENCE.exists():
        yield None  # the last test fails loudly through the reference_dir fixture
        return
    proc = subprocess.Popen([sys.executable, "-m", "snnjax.interop.spikingjelly", "check", str(REFERENCE),
                             "--impl", "pallas"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()




@st.composite
def _problems(draw):
    cfg = draw(NEURON_CONFIGS)
    T = draw(st.integers(1, 8))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=0, max_size=3)))
    # Small blocks: M is mostly not a multiple of the block, so the last block's rows are masked.
    # Chunks of 1 to T+1 steps: several full chunks, a partial last one, or one chunk for all.
    opts = P.KernelOptions(block_m=draw(st.sampled_from([4, 8, 16])),
                           block_m_backward=draw(st.sampled_from([4, 8, 16])), min_block=1,
                           time_chunk=draw(st.integers(1, T + 1)))
    v_init_ndim = draw(st.one_of(st.none(), st.integers(0, len(shape))))  # None: fresh state; else a suffix
    return (cfg, T, shape, opts, draw(st.sampled_from(["float64", "float32"])), draw(st.booleans()), v_init_ndim,
            draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=20, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_problems())
def test_pallas_equals_xla(x64, problem):  # x64 stays on for all examples
    cfg, T, shape, opts, dtype, return_v_seq, v_init_ndim, seed = problem
    x, v_init, w, ct_s, ct_v = problem_arrays(cfg, T, shape, dtype, return_v_seq, v_init_ndim, seed)

    args = (cfg, return_v_seq, opts, x, v_init, w, ct_s, ct_v)
    (s_p, v_p), grads_p = run_vjp("pallas", *args)
    (s_x, v_x), grads_x = run_vjp("xla", *args)

    assert s_p.dtype == s_x.dtype == dtype and v_p.dtype == v_x.dtype == dtype
    assert v_p.shape == ((T, *shape) if return_v_seq else shape)
    np.testing.assert_array_equal(np.asarray(s_p), np.asarray(s_x), err_msg="spikes differ")
    assert rel_error(v_p, v_x) <= RTOL[dtype], "v differs"
    for name, gp, gx in zip(("x_seq", "v_init", "w"), grads_p, grads_x):
        if gx is None:
            assert gp is None, name
            continue
        assert gp.dtype == gx.dtype and gp.shape == gx.shape, name
        err = rel_error(gp, gx)
        assert err <= RTOL[dtype], f"grad w.r.t. {name}: normwise relative error {err:.3e} > {RTOL[dtype]:g}"


# ---- float32 / bfloat16, GPU lowering, dispatch (x64 off) ------------------------------

CONFIGS = {
    "IF-soft-pq": F.NeuronConfig(kind="IF", v_reset=None, surrogate=sg.PiecewiseQuadratic()),
    "LIF-hard-detach-atan": F.NeuronConfig(kind="LIF", tau=1.5, v_reset=-0.25, detach_reset=True,
                                           surrogate=sg.ATan()),
    "LIF-soft-nodi-softsign": F.NeuronConfig(kind="LIF", decay_input=False, v_reset=None, v_threshold=0.8,
                                             surrogate=sg.SoftSign()),
    "PLIF-hard-sigmoid": F.NeuronConfig(kind="PLIF", v_threshold=1.2),
}
SHAPE = (5, 3, 47)  # M = 141: two blocks of 128, the second partial (masked rows)
OPTS = P.KernelOptions(block_m=128, block_m_backward=128, min_block=1, time_chunk=2)  # 2 chunks + a partial one


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pallas_matches_xla(name, dtype):
    cfg = CONFIGS[name]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(0.6, 0.8, SHAPE), dtype)
    v_init = jnp.asarray(rng.normal(0.0, 0.5, SHAPE[1:]), jnp.float32)
    w = jnp.asarray(rng.uniform(-1, 1), jnp.float32) if cfg.kind == "PLIF" else None
    ct_s = jnp.asarray(rng.normal(size=SHAPE), dtype)
    ct_v = jnp.asarray(rng.normal(size=SHAPE), jnp.float32)
    (s_p, v_p), g_p = run_vjp("pallas", cfg, True, OPTS, x, v_init, w, ct_s, ct_v)
    (s_x, v_x), g_x = run_vjp("xla", cfg, True, OPTS, x, v_init, w, ct_s, ct_v)
    assert s_p.dtype == dtype and v_p.dtype == jnp.float32
    assert 0 < float(jnp.mean(s_p.astype(jnp.float32))) < 1, "the example should fire some but not all"
    np.testing.assert_array_equal(np.asarray(s_p, np.float32), np.asarray(s_x, np.float32))
    np.testing.assert_array_equal(np.asarray(v_p), np.asarray(v_x))
    for what, gp, gx in zip(("dx", "dv_init", "dw"), g_p, g_x):
        assert (gp is None) == (gx is None), what
        if gx is not None:
            assert gp.dtype == gx.dtype and gp.shape == gx.shape, what
            assert rel_error(gp, gx) < (1e-2 if gp.dtype == jnp.bfloat16 else 1e-5), what


@pytest.mark.parametrize("T", [3, 8, 16, 20], ids=lambda t: f"T{t}")  # K = 8: one partial, one, two, three chunks
@pytest.mark.parametrize("return_v_seq", [False, True], ids=["v_last", "v_seq"])
def test_default_state_and_unused_v(T, return_v_seq):
    """No v_init (one start shared by every neuron) and a loss on the spikes alone (V's cotangent a symbolic zero)."""
    cfg = CONFIGS["PLIF-hard-sigmoid"]
    rng = np.random.default_rng(T)
    x = jnp.asarray(rng.normal(0.6, 0.8, (T, 5, 37)), jnp.float32)
    w, ct = jnp.asarray(0.2, jnp.float32), jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    opts = P.KernelOptions(interpret=True, block_m=64, block_m_backward=64, time_chunk=8)

    def grads(impl):
        def loss(x, w):
            if impl == "pallas":
                s, _ = P.multistep(cfg, x, None, w, return_v_seq=return_v_seq, options=opts)
            else:
                s, _ = F.multistep(cfg, x, None, w, return_v_seq=return_v_seq, impl="xla")
            return jnp.sum(s * ct)
        return jax.grad(loss, argnums=(0, 1))(x, w)

    (dx_p, dw_p), (dx_x, dw_x) = grads("pallas"), grads("xla")
    assert rel_error(dx_p, dx_x) < 1e-5 and rel_error(dw_p, dw_x) < 1e-4
    assert float(jnp.linalg.norm(dx_x)) > 0


def test_kernels_lower_for_gpu():
    opts = P.KernelOptions(interpret=False)
    for cfg, dtype, return_v_seq in [(CONFIGS["PLIF-hard-sigmoid"], jnp.bfloat16, True),
                                     (CONFIGS["LIF-soft-nodi-softsign"], jnp.float32, False),
                                     (CONFIGS["IF-soft-pq"], jnp.float16, False)]:
        def grads(x, v, w):
            out, vjp = jax.vjp(functools.partial(P.multistep, cfg, return_v_seq=return_v_seq, options=opts), x, v, w)
            return vjp(jax.tree.map(jnp.ones_like, out))

        x = jax.ShapeDtypeStruct((6, 2, 1000), dtype)
        w = jax.ShapeDtypeStruct((), jnp.float32) if cfg.kind == "PLIF" else None
        hlo = jax.jit(grads).trace(x, jax.ShapeDtypeStruct((2, 1000), jnp.float32), w).lower(
            lowering_platforms=("cuda",)).as_text()
        assert hlo.count("custom_call @__gpu$xla.gpu.triton") == 2, (cfg, dtype)  # forward and backward kernels


def test_auto_is_pallas_on_one_gpu_and_xla_under_a_layout(monkeypatch):
    cfg = F.NeuronConfig()
    x32, x16 = jnp.ones((3, 4)), jnp.ones((3, 4), jnp.bfloat16)
    assert jax.default_backend() == "cpu"
    assert F.resolve_impl("pallas", cfg, x32) == "pallas"  # interpret mode (auto on a CPU: test_native.py)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert F.resolve_impl("auto", cfg, x32) == F.resolve_impl("auto", cfg, x16) == "pallas"
    assert F.resolve_impl("xla", cfg, x32) == "xla"
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with logical.activation_rules(mesh, {"batch": "data"}):  # a plan over 8 devices is being traced
        assert F.resolve_impl("auto", cfg, x32) == "xla"
        assert F.resolve_impl("pallas", cfg, x32) == "pallas"  # an explicit choice is kept


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


def test_modules_pass_impl_through(monkeypatch):
    calls = []
    real = P.multistep
    monkeypatch.setattr(P, "multistep", lambda *a, **k: calls.append(k) or real(*a, **k))
    x = jnp.asarray(np.random.default_rng(1).normal(0.8, 0.8, (4, 2, 9)), jnp.float32)

    def loss(node, x):
        return jnp.sum(node(x) * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape) / x.size)

    results = {}
    for impl in ("xla", "pallas"):
        node = M.ParametricLIFNode(init_tau=3.0, v_reset=None, step_mode="m", impl=impl)
        assert node.impl == impl
        results[impl] = nnx.value_and_grad(loss, argnums=(0, 1))(node, x)
    assert len(calls) == 1, "impl='pallas' should run the Pallas path once, impl='xla' never"
    (l_x, (g_node_x, gx_x)), (l_p, (g_node_p, gx_p)) = results["xla"], results["pallas"]
    assert float(l_x) == float(l_p)
    np.testing.assert_allclose(np.asarray(gx_p), np.asarray(gx_x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(float(g_node_p["w"].get_value()), float(g_node_x["w"].get_value()), rtol=1e-5)


# ---- last: the checker started by the module fixture ---------------------------------

def test_cli_check_with_pallas_passes_every_reference_case(reference_dir, pallas_cli):
    assert reference_dir / "neurons.npz" == REFERENCE
    out, err = pallas_cli.communicate(timeout=900)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-3000:]
    assert lines[-1] == {"cases": 69, "failed": 0}, lines[-1]
    assert pallas_cli.returncode == 0
    assert all(line["ok"] and line["spike_mismatches"] == 0 for line in lines[:-1])
