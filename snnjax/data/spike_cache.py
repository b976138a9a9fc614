"""SHD/SSC HDF5 files: checked and copied, in a child process with a time limit, to flat memory-mapped arrays.

h5py reads one variable-length sample in about half a millisecond (two reads, measured on the
2-core development machine), ten times its per-sample cost in a bulk read; training reads samples
in random order. So the spikes are copied once, in chunks of :data:`CHUNK` samples, into
``<cache>/times.bin`` and ``units.bin`` (the samples end to end, in the file's dtypes) with
``offsets.npy`` (``[n + 1]``: sample ``i`` is ``[offsets[i], offsets[i + 1])``), ``labels.npy`` and
``key.txt`` (the format version, the HDF5 file's size, modification time and dtypes). A copy whose key no
longer matches is rebuilt; the files are written under temporary names and renamed, ``key.txt`` last, so an
interrupted build is redone rather than trusted. Training then reads only the copy, never the HDF5 file.

libhdf5 can spin for minutes on a damaged heap, in native code: the check and copy run in the child process of
:mod:`snnjax.runtime.trial_read` (which loads this file alone, importing numpy and h5py, not the snnjax
package), killed after ``timeout`` seconds. Without a copy (``cache=False``), the child reads every sample
once, so that the reads in this process later are of bytes that libhdf5 has read in bounded time.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

CHUNK = 1024
VERSION = 2  # of the copy's layout (2: with labels.npy)
OPTION = "data.options.read_timeout"


class SpikeFileError(ValueError):
    """The HDF5 file is not an intact SHD/SSC file (the message does not name it: the caller adds it)."""


def open_checked(path: Path):
    """``(h5py.File, times, units, labels [n] int64)``: the file open, its datasets checked (shapes and kinds).

    Raises:
      SpikeFileError: not HDF5, datasets missing or of another kind (not variable-length, float units), no
        samples, labels that are not whole numbers, counts that differ.
    """
    import h5py  # noqa: PLC0415 (only these datasets need it)

    try:
        file = h5py.File(path, "r")
    except Exception as err:  # noqa: BLE001 (h5py raises OSError, RuntimeError, KeyError, ... for damaged files)
        raise SpikeFileError(f"not a readable HDF5 file ({type(err).__name__}: {err}): the file is corrupt or "
                             "truncated; download it again") from err
    try:
        return (file, *_check(h5py, file))
    except SpikeFileError:
        file.close()
        raise
    except Exception as err:  # noqa: BLE001
        file.close()
        raise SpikeFileError(f"not a readable HDF5 file ({type(err).__name__}: {err}): the file is corrupt or "
                             "truncated; download it again") from err


def _check(h5py, file):
    missing = [k for k in ("spikes/times", "spikes/units", "labels") if k not in file]
    if missing:
        raise SpikeFileError(f"no {', '.join(missing)} in the file: not an SHD/SSC release file")
    for key, kinds, what in (("spikes/times", "fiu", "numbers"), ("spikes/units", "iu", "integers")):
        ds = file[key]
        base = h5py.check_vlen_dtype(ds.dtype) if isinstance(ds, h5py.Dataset) else None
        if base is None or ds.ndim != 1 or base.kind not in kinds:
            found = ("a group" if not isinstance(ds, h5py.Dataset) else
                     f"{'variable-length ' if base is not None else ''}{base or ds.dtype} of shape {ds.shape}")
            raise SpikeFileError(f"{key} is {found}; SHD/SSC files hold one variable-length array of {what} per "
                                 "sample: not an SHD/SSC release file")
    raw = file["labels"]
    if not isinstance(raw, h5py.Dataset) or raw.ndim != 1 or raw.dtype.kind not in "fiu":
        raise SpikeFileError("labels is not a 1-D numeric dataset: not an SHD/SSC release file")
    raw = raw[:]
    if raw.dtype.kind == "f" and not (np.isfinite(raw) & (raw == np.round(raw))).all():
        bad = raw[~(np.isfinite(raw) & (raw == np.round(raw)))]
        raise SpikeFileError(f"{bad.size} labels are not whole numbers (e.g. {bad[0]}): the file is corrupt")
    labels = raw.astype(np.int64)
    if not labels.size:
        raise SpikeFileError("holds no samples: the file is truncated or corrupt; download it again")
    times, units = file["spikes/times"], file["spikes/units"]
    if times.shape[0] != labels.shape[0] or units.shape[0] != labels.shape[0]:
        raise SpikeFileError(f"{times.shape[0]} spike-time arrays, {units.shape[0]} unit arrays and "
                             f"{labels.shape[0]} labels: the file is corrupt")
    return times, units, labels


def _key(path: Path, times_dtype: np.dtype, units_dtype: np.dtype) -> str:
    stat = path.stat()
    return (f"version={VERSION};size={stat.st_size};mtime_ns={stat.st_mtime_ns};times={times_dtype.str};"
            f"units={units_dtype.str}")


def _fresh_key(h5_path: Path, cache_dir: Path) -> dict[str, str] | None:
    """The copy's key fields if it is of this version and of the file as it is now, else None."""
    try:
        fields = dict(item.split("=", 1) for item in (cache_dir / "key.txt").read_text().split(";"))
        stat = h5_path.stat()
    except (OSError, ValueError):
        return None
    same = (fields.get("version") == str(VERSION) and fields.get("size") == str(stat.st_size)
            and fields.get("mtime_ns") == str(stat.st_mtime_ns))
    return fields if same and {"times", "units"} <= fields.keys() else None


def spike_arrays(h5_path: Path, cache_dir: Path,
                 timeout: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(times, units, offsets, labels)`` memory-mapped (``offsets``, ``labels`` loaded) from ``cache_dir``,
    checked and copied from the HDF5 file first if the copy is missing or stale.

    Args:
      h5_path: the HDF5 file (its size and modification time key the copy).
      cache_dir: the copy's folder.
      timeout: seconds the check and copy (in a child process) may take; None: in this process, unbounded.

    Raises:
      SpikeFileError: the file is damaged (as :func:`open_checked`; a sample that cannot be read or whose
        times and units differ in length), or it did not finish within ``timeout`` (message without the file).
      OSError: ``cache_dir`` cannot be written (the message says which option to set).
    """
    if _fresh_key(h5_path, cache_dir) is None:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _unwritable(h5_path, cache_dir, err) from err
        _run(h5_path, cache_dir, timeout)
    fields = _fresh_key(h5_path, cache_dir)
    if fields is None:
        raise SpikeFileError(f"it changed while its spikes were copied to {cache_dir}; try again")
    offsets = np.load(cache_dir / "offsets.npy", allow_pickle=False)
    labels = np.load(cache_dir / "labels.npy", allow_pickle=False)

    def mapped(name: str, dtype: np.dtype) -> np.ndarray:
        if offsets[-1] == 0:
            return np.zeros(0, dtype)
        return np.memmap(cache_dir / name, dtype=dtype, mode="r", shape=(int(offsets[-1]),))

    return mapped("times.bin", np.dtype(fields["times"])), mapped("units.bin", np.dtype(fields["units"])), \
        offsets, labels


def check_samples(h5_path: Path, timeout: float) -> None:
    """Read every sample of the HDF5 file once, in a child process, at most ``timeout`` s.

    Raises:
      SpikeFileError: as :func:`spike_arrays`.
    """
    _run(h5_path, None, timeout)


def _run(h5_path: Path, cache_dir: Path | None, timeout: float | None) -> None:
    if timeout is None:
        _convert(h5_path, cache_dir)
        return
    from snnjax.runtime.trial_read import trial_read  # noqa: PLC0415 (the child loads this file alone)

    outcome = trial_read(_CHILD, [str(h5_path), *([str(cache_dir)] if cache_dir is not None else [])], timeout,
                         OPTION, SpikeFileError)
    if outcome is None:
        return
    kind, name, message = outcome
    if kind == "OSError":
        raise OSError(message)
    raise SpikeFileError(message if name == "SpikeFileError" else
                         f"its trial read in a separate process failed ({name}: {message})")


def _child_convert(h5_path: str, cache_dir: str | None = None) -> None:
    """:func:`_convert` in the child process (:mod:`snnjax.runtime.trial_read` loads this file alone)."""
    _convert(Path(h5_path), Path(cache_dir) if cache_dir is not None else None)


_CHILD = f"{__file__}:_child_convert"


def _chunks(times, units):
    """``(start, times chunk, units chunk, lengths)`` per :data:`CHUNK` samples, read in bulk and checked."""
    n = times.shape[0]
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        try:
            chunk_t, chunk_u = times[start:stop], units[start:stop]
        except Exception as err:  # noqa: BLE001 (h5py's errors for damaged data vary)
            raise SpikeFileError(f"samples {start}..{stop - 1} cannot be read ({type(err).__name__}: {err}): "
                                 "the file is corrupt") from err
        lengths = np.zeros(stop - start, np.int64)
        for i, (t, u) in enumerate(zip(chunk_t, chunk_u, strict=True)):
            if t.shape != u.shape:
                raise SpikeFileError(f"sample {start + i} has {t.shape[0]} spike times but {u.shape[0]} units: "
                                     "the file is corrupt")
            lengths[i] = t.shape[0]
        yield start, chunk_t, chunk_u, lengths


def _convert(h5_path: Path, cache_dir: Path | None) -> None:
    """Check the file and read every sample; write the copy into ``cache_dir`` unless None."""
    file, times, units, labels = open_checked(h5_path)
    with file:
        if cache_dir is None:
            for _ in _chunks(times, units):
                pass
            return
        dtypes = np.dtype(times.dtype.metadata["vlen"]), np.dtype(units.dtype.metadata["vlen"])
        key = _key(h5_path, *dtypes)
        try:
            _build(times, units, labels, cache_dir, key)
        except OSError as err:
            raise _unwritable(h5_path, cache_dir, err) from err


def _unwritable(h5_path: Path, cache_dir: Path, err: OSError) -> OSError:
    return OSError(f"cannot write the spike copy of {h5_path} in {cache_dir} ({err}); set data.options.cache_dir "
                   "to a writable folder, or cache=False to read the HDF5 file sample by sample")


def _save(cache_dir: Path, name: str, array: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=cache_dir)
    with os.fdopen(fd, "wb") as handle:
        np.save(handle, array)
    os.replace(tmp, cache_dir / name)


def _build(times, units, labels: np.ndarray, cache_dir: Path, key: str) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "key.txt").unlink(missing_ok=True)
    lengths = np.zeros(times.shape[0], np.int64)
    handles = {}
    try:
        for name in ("times.bin", "units.bin"):
            fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=cache_dir)
            handles[name] = (os.fdopen(fd, "wb"), tmp)
        for start, chunk_t, chunk_u, chunk_lengths in _chunks(times, units):
            lengths[start:start + chunk_lengths.size] = chunk_lengths
            handles["times.bin"][0].write(b"".join(np.ascontiguousarray(t).tobytes() for t in chunk_t))
            handles["units.bin"][0].write(b"".join(np.ascontiguousarray(u).tobytes() for u in chunk_u))
        for name, (handle, tmp) in handles.items():
            handle.close()
            os.replace(tmp, cache_dir / name)
    finally:
        for handle, tmp in handles.values():
            handle.close()
            Path(tmp).unlink(missing_ok=True)
    _save(cache_dir, "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]))
    _save(cache_dir, "labels.npy", labels)
    (cache_dir / "key.txt").write_text(key)
