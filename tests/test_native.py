"""What only the native CPU kernels (C++ through XLA FFI) have; ``test_neuron_impls.py`` runs
them through every check shared by the implementations.

- Work chunks keep the backward's scratch in cache.
- Dispatch: ``auto`` falls back to XLA when the kernels cannot be built (with a warning);
  explicit ``native`` says why it cannot run; build errors name the compiler and its message.
- glibc's allocator keeps freed memory (``snnjax.runtime.hostmem``).
- Outputs large enough for the kernels' non-temporal (streaming) stores: same spikes and V
  as the XLA path, gradients to 1e-10 (float64) / 1e-5 (float32; 1e-4 for ``w``).
"""
from __future__ import annotations

import logging
import platform
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from neuron_checks import assert_same_run

from snnjax import neurons as F
from snnjax.neurons import surrogate as sg
from snnjax.neurons.compare import run_vjp
from snnjax.neurons.kernels.native import build
from snnjax.runtime import hostmem

pytestmark = pytest.mark.usefixtures("x32_module")  # the float64 tests turn x64 on for themselves


def test_chunk_size_keeps_the_scratch_in_cache():
    assert build.chunk_size(4, 10**6) == 8192 and build.chunk_size(32, 10**6) == 4096
    assert build.chunk_size(1000, 10**6) == 256
    assert build.chunk_size(4, 100) == 100 and build.chunk_size(4, 1) == 1
    assert all(build.chunk_size(t, 10**6) % 64 == 0 for t in range(1, 300))


def test_explicit_native_errors_say_why(monkeypatch):
    cfg = F.NeuronConfig()
    with pytest.raises(ValueError, match=r"impl='native' cannot run.*floating point.*int32"):
        F.multistep(cfg, jnp.ones((3, 4), jnp.int32), impl="native")
    with pytest.raises(ValueError, match=r"impl='native' cannot run.*non-empty"):
        F.multistep(cfg, jnp.ones((0, 4)), impl="native")

    class Custom(sg.Sigmoid):
        pass

    with pytest.raises(ValueError, match=r"impl='native' cannot run.*surrogate .*Custom\(alpha=4.0"):
        F.multistep(F.NeuronConfig(surrogate=Custom()), jnp.ones((3, 4)), impl="native")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(ValueError, match=r"impl='native' cannot run.*(?i:cpu) backend.*'gpu'"):
        F.resolve_impl("native", cfg, jnp.ones((3, 4)))


def test_auto_falls_back_to_xla_when_the_kernels_cannot_be_built(monkeypatch, caplog):
    def fail():
        raise build.NativeBuildError("no C++ compiler found (test)")

    monkeypatch.setattr(build, "load", fail)
    cfg = F.NeuronConfig()
    with caplog.at_level(logging.WARNING, logger="snnjax.neurons.kernels.native.build"):
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
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(build.NativeBuildError, match=r"no C\+\+ compiler found \(set \$CXX"):
        build.load.__wrapped__()


def test_keep_freed_memory_applies_on_glibc():
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
    args = (F.NeuronConfig(kind="PLIF", v_threshold=1.2), True, x, v_init, w, ct_s, ct_v)
    rtol, rtol_w = (1e-10, 1e-10) if dtype == "float64" else (1e-5, 1e-4)
    assert_same_run(run_vjp("native", *args), run_vjp("xla", *args), dx=rtol, dw=rtol_w)
