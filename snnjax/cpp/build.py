"""Compile and load C++ XLA FFI libraries for the CPU, once per machine.

``build_library`` compiles a source (the native neuron kernels, the sparse-input convolution, the oneDNN
convolution of ``snnjax.bench.conv``) with the system C++ compiler (``$CXX``, else ``g++``, else ``c++``) against
jaxlib's XLA FFI headers and this package's (``parallel_chunks.h``), for this machine's CPU (``-march=native``),
caches it under ``$SNNJAX_CACHE`` (default ``~/.cache/snnjax``), keyed by the sources, the jaxlib version, the
compiler, the flags and the CPU, loads it and registers its FFI handlers. A first build takes seconds; later
processes load the cached library.
"""
from __future__ import annotations

import ctypes
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

INCLUDE = pathlib.Path(__file__).parent  # parallel_chunks.h
log = logging.getLogger(__name__)


class NativeBuildError(RuntimeError):
    """A native CPU library could not be compiled or loaded."""


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``g++``, ``c++`` or ``clang++``."""
    for cxx in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++")):
        if shutil.which(cxx):
            return cxx
    raise NativeBuildError("no C++ compiler found (set $CXX, or install g++); the native CPU kernels need "
                           "one (without it neurons run impl='xla' and convolutions XLA's own)")


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
        cmd = [cxx, *flags(), f"-I{jax.ffi.include_dir()}", f"-I{INCLUDE}", f"-I{source.parent}", str(source),
               *extra,
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
