"""Compile and load the native CPU neuron kernels (``neuron_ffi.cc``) once per machine.

Built by ``snnjax.cpp.build`` (the system C++ compiler, cached under ``$SNNJAX_CACHE``); the first build takes
about 15 s on 2 cores, later processes load the cached library. Its handlers are registered with XLA once per
process.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import pathlib

from snnjax.cpp.build import INCLUDE, NativeBuildError, build_library, cache_dir, compiler, flags

__all__ = ["NativeBuildError", "available", "cache_dir", "chunk_size", "compiler", "flags", "load"]

HERE = pathlib.Path(__file__).parent
SOURCES = (HERE / "neuron_ffi.cc", HERE / "neuron_kernels.h", INCLUDE / "parallel_chunks.h")
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
