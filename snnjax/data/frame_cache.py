"""An on-disk cache of integrated event frames: one compressed ``.npz`` per sample.

Each cache file holds ``frames`` (float32, the cached example) and ``key``
(a string naming what it was built from: the raw file's size and modification
time and the integration settings). :func:`load_frames` returns ``None`` for a
missing, unreadable, truncated or mismatching file, so the caller rebuilds it; :func:`save_frames` writes to a
temporary file in the same folder and renames it into place, so readers
(other threads or processes) never see a partial file.
"""
from __future__ import annotations

import logging
import os
import tempfile
import threading
import zipfile
import zlib
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
# NumPy parses a .npy header with ast.literal_eval, which CPython 3.11 does not make safe from two threads at once
# (SystemError "AST constructor recursion depth mismatch", seen with two loader threads reading cached frames):
# headers are parsed one at a time, the data (the decompression) in parallel.
_HEADER_LOCK = threading.Lock()


def _read_member(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    """The array ``name`` of an ``.npz`` archive (no pickles)."""
    with archive.open(f"{name}.npy") as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{name}: .npy format {version}, which save_frames does not write")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        with _HEADER_LOCK:
            shape, fortran_order, dtype = read_header(f)
        if dtype.hasobject or fortran_order:
            raise ValueError(f"{name}: an object or Fortran-order array, which save_frames does not write")
        count = int(np.prod(shape))
        data = f.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise ValueError(f"{name}: {len(data)} bytes of data, {count * dtype.itemsize} expected")
    return np.frombuffer(data, dtype, count).reshape(shape).copy()


def load_frames(path: Path, expected_shape: tuple[int, ...], key: str) -> np.ndarray | None:
    """The cached float32 frames at ``path``, or ``None`` if absent or not built from ``key``."""
    if not path.exists():
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            frames = _read_member(archive, "frames")
            cached_key = str(_read_member(archive, "key"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        log.warning("Rebuilding unreadable frame cache %s (%s)", path, err)
        return None
    if frames.shape != tuple(expected_shape) or frames.dtype != np.float32 or cached_key != key:
        log.warning("Rebuilding stale frame cache %s (shape %s, dtype %s, built from %r, now %r)",
                    path, frames.shape, frames.dtype, cached_key, key)
        return None
    return frames


def save_frames(path: Path, frames: np.ndarray, key: str) -> None:
    """Atomically writes ``frames`` (float32) and ``key`` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, frames=np.asarray(frames, np.float32),
                                key=np.array(key))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
