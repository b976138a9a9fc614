"""Writers of the datasets' release formats, for benchmarks and tests on generated files.

Each writer produces the bytes the matching reader in :mod:`snnjax.data` decodes: jAER AEDAT 3.1
with labels CSVs (DVS128 Gesture), ATIS ``.bin`` (N-MNIST, N-Caltech101), SHD/SSC HDF5, and image files.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

AEDAT31_HEADER = (b"#!AER-DAT3.1\r\n"
                  b"#Format: RAW\r\n"
                  b"#Source 1: DVS128\r\n"
                  b"#Start-Time: 2017-01-01 00:00:00 (TZ+0000)\r\n"
                  b"#!END-HEADER\r\n")


def aedat31_bytes(t: np.ndarray, x: np.ndarray, y: np.ndarray, p: np.ndarray, valid: np.ndarray | None = None,
                  packet_events: int = 4096) -> bytes:
    """AEDAT 3.1 bytes of polarity events (``t`` microseconds, may exceed 2**31: packets carry the overflow)."""
    t = np.asarray(t, np.int64)
    valid = np.ones_like(t) if valid is None else np.asarray(valid, np.int64)
    address = (np.asarray(x, np.int64) << 17) | (np.asarray(y, np.int64) << 2) | (np.asarray(p, np.int64) << 1) | valid
    overflow = t >> 31
    chunks = [AEDAT31_HEADER]
    start = 0
    while start < t.shape[0]:
        stop = min(start + packet_events, t.shape[0])
        stop = start + int(np.count_nonzero(overflow[start:stop] == overflow[start]))  # one overflow per packet
        n = stop - start
        header = np.array([1, 1], "<i2").tobytes() + np.array(
            [8, 4, overflow[start], n, n, int(valid[start:stop].sum())], "<i4").tobytes()
        body = np.stack([address[start:stop], t[start:stop] & 0x7FFFFFFF], 1).astype("<u4").tobytes()
        chunks += [header, body]
        start = stop
    return b"".join(chunks)


def write_gesture_recording(folder: Path, name: str, windows: list[tuple[int, int, int]], events_per_sample: int,
                            rng: np.random.Generator) -> None:
    """``folder/name.aedat`` with ``events_per_sample`` events inside each ``(class, start, end)`` window and
    ``folder/name_labels.csv`` listing the windows."""
    parts = []
    for _, start, end in windows:
        parts.append(np.sort(rng.integers(start, end, events_per_sample)))
    t = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    n = t.shape[0]
    data = aedat31_bytes(t, rng.integers(0, 128, n), rng.integers(0, 128, n), rng.integers(0, 2, n))
    (folder / f"{name}.aedat").write_bytes(data)
    lines = ["class,startTime_usec,endTime_usec"] + [f"{c},{s},{e}" for c, s, e in windows]
    (folder / f"{name}_labels.csv").write_text("\n".join(lines) + "\n")


def atis_bytes(t: np.ndarray, x: np.ndarray, y: np.ndarray, p: np.ndarray) -> bytes:
    """ATIS ``.bin`` bytes: per event x, y, then polarity bit and a 23-bit timestamp, big-endian."""
    t = np.asarray(t, np.int64)
    out = np.empty((t.shape[0], 5), np.uint8)
    out[:, 0], out[:, 1] = x, y
    out[:, 2] = (np.asarray(p, np.int64) << 7) | ((t >> 16) & 0x7F)
    out[:, 3], out[:, 4] = (t >> 8) & 0xFF, t & 0xFF
    return out.tobytes()


def write_heidelberg_h5(path: str | os.PathLike, times: list[np.ndarray], units: list[np.ndarray],
                        labels: np.ndarray) -> None:
    """An SHD/SSC-layout HDF5 file: ``spikes/times`` (float16 s), ``spikes/units`` and ``labels`` (uint16)."""
    import h5py  # noqa: PLC0415

    def ragged(arrays, dtype):
        out = np.empty(len(arrays), dtype=object)
        out[:] = [np.asarray(a, dtype) for a in arrays]
        return out

    with h5py.File(path, "w") as f:
        spikes = f.create_group("spikes")
        spikes.create_dataset("times", data=ragged(times, np.float16), dtype=h5py.vlen_dtype(np.float16))
        spikes.create_dataset("units", data=ragged(units, np.uint16), dtype=h5py.vlen_dtype(np.uint16))
        f.create_dataset("labels", data=np.asarray(labels, np.uint16))


def random_spikes(rng: np.random.Generator, count: int, length_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` sorted float16 spike times in ``[0, length_s)`` seconds and their units in [0, 700)."""
    return np.sort(rng.uniform(0, length_s, count)).astype(np.float16), rng.integers(0, 700, count).astype(np.uint16)


def smooth_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """``[height, width, 3]`` uint8: low-frequency colour fields plus mild noise (compresses like a photograph)."""
    coarse = rng.uniform(0, 255, (height // 32 + 2, width // 32 + 2, 3))
    rows = np.linspace(0, coarse.shape[0] - 1.001, height)
    cols = np.linspace(0, coarse.shape[1] - 1.001, width)
    r0, c0 = rows.astype(int), cols.astype(int)
    fr, fc = (rows - r0)[:, None, None], (cols - c0)[None, :, None]
    image = ((1 - fr) * (1 - fc) * coarse[r0][:, c0] + fr * (1 - fc) * coarse[r0 + 1][:, c0]
             + (1 - fr) * fc * coarse[r0][:, c0 + 1] + fr * fc * coarse[r0 + 1][:, c0 + 1])
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)
