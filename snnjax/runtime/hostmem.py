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

It also keeps every thread on the main heap (one arena). XLA:CPU allocates a step's buffers
on its worker threads, whose own arenas grow in 64 MiB heaps that glibc unmaps as soon as
one is empty, whatever the trim threshold: the peers benchmark's Linear + LIF step over
``[500, 16, 1024]`` (32 MiB per array) still faulted about 100 MiB per call with the
thresholds alone, none with one arena (its CPU time 2-8% lower, two runs on a loaded machine). Small blocks stay
per-thread in glibc's thread caches, so the shared arena's lock is rarely taken.

``train.py`` and the neuron benchmark call it at startup (both sides of the SpikingJelly
comparison); library code never does. Pure ctypes: no JAX import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """No mmap'd blocks, a 1 GiB trim threshold and one arena for glibc's malloc; True if applied (False off
    glibc). Call it before the threads that allocate start (a thread keeps the arena it first took)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl and BSD libcs lack it)
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all(mallopt(option, value) for option, value in
               ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)))
