"""The native CPU neuron kernels (``snnjax.native``, C++ through XLA FFI) against the XLA path.

- Every SpikingJelly case of ``../shared/reference/neurons.npz`` through ``impl="native"``.
- Hypothesis, in float64 or float32: random neuron configurations (IF / LIF / PLIF, tau,
  decay_input, threshold, hard or soft reset, detach_reset, every surrogate with a random
  alpha), random T and trailing shapes, random or default ``v_init``, both output forms.
  Spikes and V must equal the XLA path's bit for bit (the kernels round as XLA's CPU
  backend does); gradients w.r.t. ``x_seq``, ``v_init`` and PLIF's ``w`` agree to 1e-10
  normwise in float64 (1e-5 in float32; 1e-4 for ``w``, a sum over every neuron-step).
- Several work chunks with a partial last one (run on XLA's thread pool), and float32 /
  bfloat16 inputs with float32 state: same spikes and V as the XLA path, same dtypes.
- Dispatch: ``auto`` is native on one CPU device and XLA under a multi-device layout or
  when the kernels cannot be built (with a warning); explicit ``native`` says why it
  cannot run; build errors name the compiler and its message.
"""
from __future__ import annotations

import functools
import json
import logging
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snnjax import hostmem
from snnjax.native import build
from snnjax.native import neuron as N
from snnjax.neurons import functional as F
from snnjax.neurons import surrogate as sg
from snnjax.pallas.check import rel_error
from snnjax.parallel import logical
from strategies import NEURON_CONFIGS, problem_arrays

pytestmark = pytest.mark.usefixtures("x32_module")  # the float64 tests turn x64 on for themselves
RTOL = {"float64": 1e-10, "float32": 1e-5}
REFERENCE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "reference" / "neurons.npz"


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def run_vjp(impl: str, cfg: F.NeuronConfig, return_v_seq: bool, x, v_init, w, ct_s, ct_v):
    """Outputs of ``multistep(impl=...)`` and their VJP w.r.t. (x, v_init, w) for cotangents (ct_s, ct_v)."""
    out, vjp = jax.vjp(functools.partial(F.multistep, cfg, return_v_seq=return_v_seq, impl=impl), x, v_init, w)
    return out, vjp((ct_s, ct_v))


def assert_matches_xla(cfg, return_v_seq, x, v_init, w, ct_s, ct_v, rtol, rtol_w):
    (s_n, v_n), grads_n = run_vjp("native", cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    (s_x, v_x), grads_x = run_vjp("xla", cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    assert s_n.dtype == s_x.dtype and v_n.dtype == v_x.dtype and v_n.shape == v_x.shape
    np.testing.assert_array_equal(np.asarray(s_n, np.float64), np.asarray(s_x, np.float64), err_msg="spikes")
    if x.shape[0] == 1 and v_init is not None and np.ndim(v_init) < x.ndim - 1:
        # XLA drops a one-step loop and rounds a broadcast start's decay before adding X (neuron.py).
        # One rounding of a term apart: half an ulp of |V_0| + |X|, whatever the cancellation in V.
        atol = np.finfo(v_x.dtype).eps * (np.abs(x).max() + np.abs(v_init).max())
        np.testing.assert_allclose(np.asarray(v_n), np.asarray(v_x), rtol=0, atol=atol, err_msg="v")
    else:
        np.testing.assert_array_equal(np.asarray(v_n), np.asarray(v_x), err_msg="v")
    for name, gn, gx in zip(("x_seq", "v_init", "w"), grads_n, grads_x):
        assert (gn is None) == (gx is None), name
        if gx is None:
            continue
        assert gn.dtype == gx.dtype and gn.shape == gx.shape, name
        tol = rtol_w if name == "w" else rtol
        assert rel_error(gn, gx) <= tol, f"grad w.r.t. {name}: {rel_error(gn, gx):.3e} > {tol:g}"
    return s_n


def test_cli_check_with_native_passes_every_reference_case(reference_dir):
    assert reference_dir / "neurons.npz" == REFERENCE
    # A subprocess: the checker turns x64 on for its whole process.
    proc = subprocess.run([sys.executable, "-m", "snnjax.interop.spikingjelly", "check", str(REFERENCE),
                           "--impl", "native"], capture_output=True, text=True, timeout=900)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-3000:]
    assert lines[-1] == {"cases": 69, "failed": 0}, [ln for ln in lines if not ln.get("ok", True)][:3]
    assert proc.returncode == 0
    assert all(line["ok"] and line["spike_mismatches"] == 0 for line in lines[:-1])


@st.composite
def _problems(draw):
    cfg = draw(NEURON_CONFIGS)
    T = draw(st.integers(1, 9))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=0, max_size=3)))
    v_init_ndim = draw(st.one_of(st.none(), st.integers(0, len(shape))))  # None: fresh state; else a suffix
    return (cfg, T, shape, draw(st.sampled_from(["float64", "float32"])), draw(st.booleans()), v_init_ndim,
            draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=30, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_problems())
def test_native_equals_xla(x64, problem):  # x64 stays on for all examples
    cfg, T, shape, dtype, return_v_seq, v_init_ndim, seed = problem
    x, v_init, w, ct_s, ct_v = problem_arrays(cfg, T, shape, dtype, return_v_seq, v_init_ndim, seed)
    rtol_w = 1e-10 if dtype == "float64" else 1e-4
    assert_matches_xla(cfg, return_v_seq, x, v_init, w, ct_s, ct_v, RTOL[dtype], rtol_w)


CONFIGS = {
    "IF-soft-pq": F.NeuronConfig(kind="IF", v_reset=None, surrogate=sg.PiecewiseQuadratic()),
    "LIF-hard-detach-atan": F.NeuronConfig(kind="LIF", tau=1.5, v_reset=-0.25, detach_reset=True,
                                           surrogate=sg.ATan()),
    "LIF-soft-nodi-softsign": F.NeuronConfig(kind="LIF", decay_input=False, v_reset=None, v_threshold=0.8,
                                             surrogate=sg.SoftSign()),
    "LIF-hard-nodi-vr": F.NeuronConfig(kind="LIF", tau=3.0, decay_input=False, v_reset=-0.3),
    "PLIF-hard-sigmoid": F.NeuronConfig(kind="PLIF", v_threshold=1.2),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_several_chunks_and_half_precision_inputs(name, dtype):
    cfg = CONFIGS[name]
    shape = (4, 3, 2 * N.chunk_size(4, 10**6) // 3 + 5)  # M = 2 chunks + 15 neurons: a partial third chunk
    assert shape[1] * shape[2] % N.chunk_size(4, 10**6) != 0 and shape[1] * shape[2] > 2 * N.chunk_size(4, 10**6)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(0.6, 0.8, shape), dtype)
    v_init = jnp.asarray(rng.normal(0.0, 0.5, shape[1:]), jnp.float32)
    w = jnp.asarray(rng.uniform(-1, 1), jnp.float32) if cfg.kind == "PLIF" else None
    ct_s = jnp.asarray(rng.normal(size=shape), dtype)
    ct_v = jnp.asarray(rng.normal(size=shape), jnp.float32)
    s = assert_matches_xla(cfg, True, x, v_init, w, ct_s, ct_v, 1e-2 if dtype == jnp.bfloat16 else 1e-5, 1e-4)
    assert s.dtype == dtype and 0 < float(jnp.mean(s.astype(jnp.float32))) < 1


def test_chunk_size_keeps_the_scratch_in_cache():
    assert N.chunk_size(4, 10**6) == 8192 and N.chunk_size(32, 10**6) == 4096 and N.chunk_size(1000, 10**6) == 256
    assert N.chunk_size(4, 100) == 100 and N.chunk_size(4, 1) == 1
    assert all(N.chunk_size(t, 10**6) % 64 == 0 for t in range(1, 300))


def test_auto_is_native_on_one_cpu_device_and_xla_under_a_layout(monkeypatch):
    cfg = F.NeuronConfig()
    x = jnp.ones((3, 4))
    assert jax.default_backend() == "cpu"
    assert F.resolve_impl("auto", cfg, x) == "native" and F.resolve_impl("native", cfg, x) == "native"
    one_step = jnp.ones((1, 4))  # no time loop: XLA fuses the update into its neighbours
    assert F.resolve_impl("auto", cfg, one_step) == "xla" and F.resolve_impl("native", cfg, one_step) == "native"
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with logical.activation_rules(mesh, {"batch": "data"}):  # a plan over 8 devices is being traced
        assert F.resolve_impl("auto", cfg, x) == "xla"
        assert F.resolve_impl("native", cfg, x) == "native"  # an explicit choice is kept
    monkeypatch.setattr(F, "AUTO_NATIVE_ON_CPU", False)
    assert F.resolve_impl("auto", cfg, x) == "xla"


def test_explicit_native_errors_say_why(monkeypatch):
    cfg = F.NeuronConfig()
    with pytest.raises(ValueError, match=r"impl='native' cannot run.*floating point.*int32"):
        F.multistep(cfg, jnp.ones((3, 4), jnp.int32), impl="native")
    with pytest.raises(ValueError, match=r"impl='native' cannot run.*non-empty"):
        F.multistep(cfg, jnp.ones((0, 4)), impl="native")

    class Custom(sg.Sigmoid):
        pass

    with pytest.raises(ValueError, match=r"impl='native' cannot run.*surrogate Custom"):
        F.multistep(F.NeuronConfig(surrogate=Custom()), jnp.ones((3, 4)), impl="native")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(ValueError, match=r"impl='native' cannot run.*CPU backend.*'gpu'"):
        F.resolve_impl("native", cfg, jnp.ones((3, 4)))


def test_auto_falls_back_to_xla_when_the_kernels_cannot_be_built(monkeypatch, caplog):
    def fail():
        raise build.NativeBuildError("no C++ compiler found (test)")

    monkeypatch.setattr(build, "load", fail)
    cfg = F.NeuronConfig()
    with caplog.at_level(logging.WARNING, logger="snnjax.native.build"):
        assert F.resolve_impl("auto", cfg, jnp.ones((3, 4))) == "xla"
    assert "using the XLA path: no C++ compiler found (test)" in caplog.text
    with pytest.raises(build.NativeBuildError, match=r"no C\+\+ compiler"):
        F.multistep(cfg, jnp.ones((3, 4)), impl="native")


def test_build_errors_name_the_compiler_and_its_message(monkeypatch, tmp_path):
    monkeypatch.setenv("SNNJAX_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    with pytest.raises(build.NativeBuildError, match=r"compiling neuron_ffi.cc failed:\nfalse -O3"):
        build.load.__wrapped__()
    assert not list(tmp_path.glob("*.so")), "a failed build must leave no library in the cache"
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.NativeBuildError, match=r"no C\+\+ compiler found \(set \$CXX"):
        build.load.__wrapped__()


def test_keep_freed_memory_applies_on_glibc():
    import platform

    applied = hostmem.keep_freed_memory()
    assert applied is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    assert hostmem.keep_freed_memory() is applied  # once per process


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_outputs_through_the_streaming_stores(x64, dtype):
    # [T, M] outputs just over the kernels' kStreamMinBytes (8 MiB, neuron_kernels.h) are written
    # with non-temporal stores on x86; an odd M leaves most rows unaligned to 32 bytes.
    T, M = (4, 2**19 + 3) if dtype == "float32" else (2, 2**19 + 3)
    rng = np.random.default_rng(1)
    x = rng.normal(0.6, 0.8, (T, M)).astype(dtype)
    v_init = rng.normal(0.0, 0.5, (M,)).astype(dtype)
    w = np.asarray(0.3, dtype)
    ct_s, ct_v = rng.normal(size=(2, T, M)).astype(dtype)
    rtol_w = 1e-10 if dtype == "float64" else 1e-4
    assert_matches_xla(CONFIGS["PLIF-hard-sigmoid"], True, x, v_init, w, ct_s, ct_v, RTOL[dtype], rtol_w)
