"""A flat, memory-mapped copy of an SHD/SSC file's spikes, for fast random access.

h5py reads one variable-length sample in about half a millisecond (two reads, measured on the
2-core development machine), ten times its per-sample cost in a bulk read; training reads samples
in random order. So the spikes are copied once, in chunks of :data:`CHUNK` samples, into
``<cache>/times.bin`` and ``units.bin`` (the samples end to end, in the file's dtypes) with
``offsets.npy`` (``[n + 1]``: sample ``i`` is ``[offsets[i], offsets[i + 1])``) and ``key.txt``
(the HDF5 file's size, modification time and dtypes). A copy whose key no longer matches is
rebuilt; the files are written under temporary names and renamed, ``key.txt`` last, so an
interrupted build is redone rather than trusted.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

CHUNK = 1024


def _key(path: Path, times_dtype: np.dtype, units_dtype: np.dtype) -> str:
    stat = path.stat()
    return f"size={stat.st_size};mtime_ns={stat.st_mtime_ns};times={times_dtype.str};units={units_dtype.str}"


def spike_arrays(h5_path: Path, times, units, cache_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(times, units, offsets)`` memory-mapped from ``cache_dir``, built from the h5py datasets if stale.

    Args:
      h5_path: the HDF5 file (its size and modification time key the copy).
      times, units: its ``spikes/times`` and ``spikes/units`` datasets (variable-length).
      cache_dir: the copy's folder.

    Raises:
      OSError: ``cache_dir`` cannot be written (the message says which option to set).
    """
    times_dtype, units_dtype = np.dtype(times.dtype.metadata["vlen"]), np.dtype(units.dtype.metadata["vlen"])
    key = _key(h5_path, times_dtype, units_dtype)
    key_file = cache_dir / "key.txt"
    if not (key_file.exists() and key_file.read_text() == key):
        try:
            _build(times, units, cache_dir, key)
        except OSError as err:
            raise OSError(f"cannot write the spike copy of {h5_path} in {cache_dir} ({err}); set "
                          "data.options.cache_dir to a writable folder, or cache=False to read the HDF5 file "
                          "sample by sample") from err
    offsets = np.load(cache_dir / "offsets.npy", allow_pickle=False)

    def mapped(name: str, dtype: np.dtype) -> np.ndarray:
        if offsets[-1] == 0:
            return np.zeros(0, dtype)
        return np.memmap(cache_dir / name, dtype=dtype, mode="r", shape=(int(offsets[-1]),))

    return mapped("times.bin", times_dtype), mapped("units.bin", units_dtype), offsets


def _build(times, units, cache_dir: Path, key: str) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "key.txt").unlink(missing_ok=True)
    n = times.shape[0]
    lengths = np.zeros(n, np.int64)
    handles = {}
    try:
        for name in ("times.bin", "units.bin"):
            fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=cache_dir)
            handles[name] = (os.fdopen(fd, "wb"), tmp)
        for start in tqdm(range(0, n, CHUNK), desc=f"copying spikes to {cache_dir}", unit="chunk", leave=False):
            stop = min(start + CHUNK, n)
            chunk_t, chunk_u = times[start:stop], units[start:stop]
            for i, (t, u) in enumerate(zip(chunk_t, chunk_u, strict=True)):
                if t.shape != u.shape:
                    raise ValueError(f"sample {start + i} has {t.shape[0]} spike times but {u.shape[0]} units")
                lengths[start + i] = t.shape[0]
            handles["times.bin"][0].write(b"".join(np.ascontiguousarray(t).tobytes() for t in chunk_t))
            handles["units.bin"][0].write(b"".join(np.ascontiguousarray(u).tobytes() for u in chunk_u))
        for name, (handle, tmp) in handles.items():
            handle.close()
            os.replace(tmp, cache_dir / name)
    finally:
        for handle, tmp in handles.values():
            handle.close()
            Path(tmp).unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="offsets.", suffix=".tmp", dir=cache_dir)
    with os.fdopen(fd, "wb") as handle:
        np.save(handle, np.concatenate([[0], np.cumsum(lengths)]))
    os.replace(tmp, cache_dir / "offsets.npy")
    (cache_dir / "key.txt").write_text(key)
