"""Compile and load the native CPU neuron kernels (``neuron_ffi.cc``) once per machine.

``build_library`` is the general step (any FFI source: the neuron kernels, the oneDNN convolution of
``snnjax.bench.conv``). The shared library is built with the system C++ compiler (``$CXX``, else ``g++``,
else ``c++``) against jaxlib's XLA FFI headers, for this machine's CPU
(``-march=native``), and cached under ``$SNNJAX_CACHE`` (default
``~/.cache/snnjax``), keyed by the sources, the jaxlib version, the compiler and
the CPU. The first build takes about 15 s on 2 cores; later processes load the
cached library. Its handlers are registered with XLA once per process.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence

import jax
import jaxlib

HERE = pathlib.Path(__file__).parent
SOURCES = (HERE / "neuron_ffi.cc", HERE / "neuron_kernels.h", HERE / "parallel_chunks.h")
TARGETS = {
    "forward": {"float32": "SnnNeuronForwardF32", "float64": "SnnNeuronForwardF64"},
    "backward": {"float32": "SnnNeuronBackwardF32", "float64": "SnnNeuronBackwardF64"},
    "step_forward": {"float32": "SnnStepForwardF32", "float64": "SnnStepForwardF64"},
    "step_backward": {"float32": "SnnStepBackwardF32", "float64": "SnnStepBackwardF64"},
}
log = logging.getLogger(__name__)


# A chunk's backward scratch (H for T steps) is T * chunk values: at most 512 KiB in float32,
# about a core's L2 cache. Longer chunks amortise the per-step loop overhead; on the 2-core
# development CPU 8192 beat 2048 and 4096 at T = 4 to 16 and tied 4096 at T = 32.
_SCRATCH_VALUES = 131072
_CHUNK_MIN, _CHUNK_MAX = 256, 8192


def chunk_size(t: int, m: int) -> int:
    """Neurons per work item of every native kernel: the backward's ``[t, chunk]`` scratch fits in L2 (``t`` the
    steps times the state variables); a multiple of 64."""
    chunk = max(_CHUNK_MIN, min(_CHUNK_MAX, _SCRATCH_VALUES // max(t, 1))) // 64 * 64
    return max(1, min(chunk, m))


class NativeBuildError(RuntimeError):
    """The native kernels could not be compiled or loaded."""


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``g++``, ``c++`` or ``clang++``."""
    for cxx in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++")):
        if shutil.which(cxx):
            return cxx
    raise NativeBuildError("no C++ compiler found (set $CXX, or install g++); the native CPU neuron kernels "
                           "need one. impl='xla' runs without it.")


def flags() -> list[str]:
    """The compiler flags of every native kernel (the built-in ones and ``codegen``'s)."""
    # -ffp-contract=off: no fused multiply-adds the XLA path does not make, so the spikes are
    # the same bits; -fno-trapping-math lets the branch-free selects vectorise.
    flags = ["-O3", "-march=native", "-ffp-contract=off", "-fno-trapping-math", "-std=c++17", "-shared", "-fPIC", "-w"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-mprefer-vector-width=256")
    return flags


def _cpu_id() -> bytes:
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
        return "\n".join(ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))).encode()
    except OSError:
        return platform.processor().encode()


def cache_dir() -> pathlib.Path:
    """Where compiled kernels are cached: ``$SNNJAX_CACHE``, default ``~/.cache/snnjax``."""
    return pathlib.Path(os.environ.get("SNNJAX_CACHE", pathlib.Path.home() / ".cache" / "snnjax"))


def _compile(cxx: str, what: str, source: pathlib.Path, extra: Sequence[str], out: pathlib.Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_lib = pathlib.Path(tmp) / out.name
        cmd = [cxx, *flags(), f"-I{jax.ffi.include_dir()}", f"-I{source.parent}", str(source), *extra,
               "-o", str(tmp_lib)]
        log.warning("compiling the %s (once per machine; cached in %s)", what, out.parent)
        start = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode:
            raise NativeBuildError(f"compiling {source.name} failed:\n{' '.join(cmd)}\n{result.stderr[-3000:]}")
        os.replace(tmp_lib, out)  # atomic: concurrent builders never load a partial library
        log.warning("compiled the %s in %.1f s", what, time.perf_counter() - start)


def build_library(name: str, what: str, sources: Sequence[pathlib.Path], targets: Iterable[str],
                  extra: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile ``sources[0]`` (the others: headers it includes, hashed for the cache key) with ``flags()`` and
    ``extra`` (more flags, libraries to link) into the cache, load it and register its FFI handlers ``targets``
    for the CPU platform. ``what`` names the library in the log and in errors.

    Raises NativeBuildError (with the compiler's message) when it cannot be built or loaded.
    """
    cxx = compiler()
    key = hashlib.sha256()
    for src in sources:
        key.update(src.read_bytes())
    for part in (jaxlib.__version__, cxx, " ".join(flags()), " ".join(extra)):
        key.update(part.encode())
    key.update(_cpu_id())
    lib_path = cache_dir() / f"snnjax_{name}_{key.hexdigest()[:16]}.so"
    if not lib_path.exists():
        _compile(cxx, what, sources[0], extra, lib_path)
    try:
        lib = ctypes.cdll.LoadLibrary(str(lib_path))
    except OSError as e:
        raise NativeBuildError(f"loading {lib_path} failed ({e}); delete it to rebuild") from e
    for symbol in targets:
        jax.ffi.register_ffi_target(symbol, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return lib


@functools.cache
def load() -> ctypes.CDLL:
    """The compiled neuron kernels, with their FFI handlers registered for the CPU platform.

    Raises NativeBuildError (with the compiler's message) when it cannot be built; the
    failure is cached for the process.
    """
    return build_library("neuron_kernels", "native CPU neuron kernels", SOURCES,
                         [symbol for per_dtype in TARGETS.values() for symbol in per_dtype.values()])


def available() -> bool:
    """Whether the native kernels are (or can be) built and loaded here."""
    try:
        load()
    except NativeBuildError as e:
        _warn_once(str(e))
        return False
    return True


@functools.cache
def _warn_once(message: str) -> None:
    log.warning("native CPU neuron kernels unavailable, using the XLA path: %s", message)
