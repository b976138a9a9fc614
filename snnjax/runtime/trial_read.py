"""Reading an untrusted file first in a child process, with a time limit.

libhdf5 (native code under h5py) can spin for minutes on a damaged heap, or crash; neither can be interrupted
from Python. So the readers of HDF5 files (NIR graphs, SHD/SSC) read a file once in a child Python process
first: a child still busy after the limit is killed, and its hang, like its crash, becomes an error in the
caller instead.

The child is this file run as a script (``python -P trial_read.py``: the standard library only, not the snnjax
package and its JAX). It stays up between reads, one per process, so that only the first read pays its start
and its imports (numpy and h5py ~0.3 s, nir ~0.7 s); it is started again after a hang or a crash. Each read's
address space is capped (``_limit_memory``): an allocation past it raises ``MemoryError`` in the child. Requests are
JSON lines on its stdin, ``[target, args]``; replies, JSON lines on its stdout after :data:`_MARK` (libraries
may print there too): ``[None]``, or ``[kind, exception type, message]`` of what the target raised (kind
``"OSError"`` for an ``OSError``, else ``"Error"``).
"""
from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

READ_TIMEOUT = 120.0  # default seconds a trial read may take
_MARK = b"\x00snnjax-trial-read\x00"


def check_timeout(timeout: float, option: str, error: type[ValueError] = ValueError) -> None:
    """Raise ``error`` naming ``option`` unless ``timeout`` is a positive number of seconds."""
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise error(f"{option} must be a positive number of seconds, got {timeout!r}")


class _Child:
    """The child process and the bytes of its stdout not yet parsed."""

    def __init__(self):
        self.pid = os.getpid()  # of the parent: a forked parent starts its own child
        self.proc = subprocess.Popen([sys.executable, "-P", __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buffer = b""

    def call(self, request: bytes, deadline: float) -> list | None:
        """The reply to ``request``; None if the child exited; ``TimeoutError`` past ``deadline``."""
        try:
            self.proc.stdin.write(request + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        fd = self.proc.stdout.fileno()
        while True:
            line, newline, rest = self.buffer.partition(b"\n")
            if newline:
                self.buffer = rest
                if _MARK in line:
                    return json.loads(line.split(_MARK, 1)[1])
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self.buffer += chunk

    def stop(self) -> int:
        """Kill the child (if still running) and return its exit status."""
        self.proc.kill()
        code = self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
        return code


_lock = threading.Lock()
_child: _Child | None = None


def trial_read(target: str, args: Sequence[str], timeout: float, option: str,
               error: type[ValueError] = ValueError) -> tuple[str, str, str] | None:
    """Call ``target(*args)`` in the child process, at most ``timeout`` seconds.

    Args:
      target: ``"module:function"`` (an importable module) or ``"/path/to/file.py:function"`` (loaded from
        that file, so that the child need not import the package it is in).
      args: strings.
      timeout: seconds, the child's start included when it is not yet running.
      option: the argument or config key that sets ``timeout``, named in the error.
      error: the exception raised (its message does not name the file: the caller adds it).

    Returns:
      None if the target returned, else ``(kind, exception type, message)`` of what it raised (kind
      ``"OSError"`` or ``"Error"``).

    Raises:
      error: ``timeout`` is not positive, the target ran past it (the child is killed), the child died (a
        crash in native code: its signal), or the target ran out of the memory a trial read allows.
    """
    global _child
    check_timeout(timeout, option, error)
    request = json.dumps([target, list(args)]).encode()
    with _lock:
        if _child is None or _child.pid != os.getpid() or _child.proc.poll() is not None:
            _child = _Child()
        try:
            reply = _child.call(request, time.monotonic() + timeout)
        except TimeoutError:
            _child.stop()
            _child = None
            raise error(f"reading it did not finish within {option}={timeout:g} s (a trial read in a separate "
                        "process; damaged HDF5 heaps make libhdf5 spin): the file is damaged") from None
        if reply is None:
            code = _child.stop()
            _child = None
            if code < 0:
                raise error(f"reading it crashed the HDF5 library (signal {-code}, in a trial read in a separate "
                            "process): the file is damaged")
            raise error(f"its trial read in a separate process exited with status {code}")
    if reply[0] is not None and reply[1] == "MemoryError":
        raise error("reading it asked for more memory than a trial read allows (1 GiB and 4x the file's size, in a "
                    "separate process: MemoryError): the file is damaged")
    return None if reply[0] is None else tuple(reply)


@atexit.register
def _stop_child() -> None:
    if _child is not None and _child.pid == os.getpid():
        _child.stop()


def _resolve(target: str, modules: dict):
    where, name = target.rsplit(":", 1)
    if where not in modules:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"_trial_read_{len(modules)}", where)
            modules[where] = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(modules[where])
        else:
            modules[where] = importlib.import_module(where)
    return getattr(modules[where], name)


def _limit_memory(args: list) -> None:
    """Caps the child's address space for one read: what it maps now, plus 1 GiB, plus 4x the size of each file
    argument (a damaged HDF5 heap made libhdf5 allocate 3.5 GB for a 9 KB file; now a ``MemoryError``). Linux only
    (``/proc/self/statm``); only the soft limit moves, so a later read may raise it again."""
    try:
        import resource  # noqa: PLC0415 (POSIX only)

        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return
    files = sum(os.path.getsize(a) for a in args if isinstance(a, str) and os.path.isfile(a))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = mapped + (1 << 30) + 4 * files
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _serve() -> None:
    """The child: one reply per request line, until stdin closes."""
    modules: dict = {}
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        target, args = json.loads(line)
        try:
            _limit_memory(args)
            _resolve(target, modules)(*args)
            reply = [None]
        except Exception as err:  # noqa: BLE001 (any error of the read goes back to the caller)
            reply = ["OSError" if isinstance(err, OSError) else "Error", type(err).__name__, str(err)]
        out.write(b"\n" + _MARK + json.dumps(reply).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
