"""Reading an untrusted file first in a child process, with a time limit.

libhdf5 (native code under h5py) can spin for minutes on a damaged heap, or crash; neither can be interrupted
from Python. So the readers of HDF5 files (NIR graphs, SHD/SSC) read a file once in a child Python process
first: a child still running after the limit is killed, and its hang, like its crash, becomes an error in the
caller instead.
"""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

READ_TIMEOUT = 120.0  # default seconds a trial read may take


def check_timeout(timeout: float, option: str, error: type[ValueError] = ValueError) -> None:
    """Raise ``error`` naming ``option`` unless ``timeout`` is a positive number of seconds."""
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise error(f"{option} must be a positive number of seconds, got {timeout!r}")


def trial_read(args: Sequence[str], timeout: float, option: str,
               error: type[ValueError] = ValueError) -> subprocess.CompletedProcess[str]:
    """Run ``python *args`` in a child process, at most ``timeout`` seconds; its stdout and stderr as text.

    Args:
      args: the child's arguments after the interpreter (e.g. ``["-c", code, path]``).
      timeout: seconds.
      option: the argument or config key that sets ``timeout``, named in the error.
      error: the exception raised (its message does not name the file: the caller adds it).

    Raises:
      error: ``timeout`` is not positive, the child ran past it (it is killed), or it died of a signal.
        A child that exits with a status (a Python error) returns: the caller reads its output.
    """
    check_timeout(timeout, option, error)
    try:
        result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise error(f"reading it did not finish within {option}={timeout:g} s (a trial read in a separate "
                    "process; damaged HDF5 heaps make libhdf5 spin): the file is damaged") from None
    if result.returncode < 0:
        raise error(f"reading it crashed the HDF5 library (signal {-result.returncode}, in a trial read in a "
                    "separate process): the file is damaged")
    return result
