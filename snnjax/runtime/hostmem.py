"""Keep freed host memory in the process for reuse (glibc), instead of handing it back to the kernel.

A CPU training step allocates the same large buffers every step (activations, spikes,
gradients: tens of MB each). glibc's malloc serves blocks above its mmap threshold
(128 KiB, rising to at most 32 MiB as blocks are freed) with fresh ``mmap`` pages and
returns them, and trims the heap top above its trim threshold, so every step pays a page
fault per 4 KiB of those buffers on first touch: measured on a 2-core machine, LIF
forward + backward over [4, 64, 16384] float32 took 8000 faults and 16-19 ms of kernel
time per call (at T = 8, with 32 MiB buffers: 16600 faults, 39 ms). ``keep_freed_memory()``
serves every block from the heap (no mmap) and raises the trim threshold (mallopt), so
freed blocks are reused; the process's resident memory then stays near its peak.

``train.py`` and the neuron benchmark call it at startup (both sides of the SpikingJelly
comparison); library code never does. Pure ctypes: no JAX import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """No mmap'd blocks and a 1 GiB trim threshold for glibc's malloc; True if applied (False off glibc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl and BSD libcs lack it)
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
