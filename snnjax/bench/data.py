"""Loader throughput from files on disk in each dataset's release format: snnjax's loader against grain's.

    python -m snnjax.bench.data --dataset {dvs128_gesture,ncaltech101,shd,ssc,image_folder}
        [--examples N] [--batch-size B] [--time-steps T] [--workers 1 2]
        [--loaders snnjax grain-threads grain-processes] [--dir DIR] [--out FILE.jsonl]

Writes ``--examples`` generated examples (:mod:`snnjax.bench.data_formats`) into ``--dir`` (a fresh
temporary folder by default), then for each worker count and loader reads one epoch of training batches
(with the augmentation keys, 2 batches ahead) and reports samples/s:

* ``snnjax``: :class:`snnjax.data.Loader`, the source's ``num_workers`` threads decoding each batch's
  examples and a prefetch thread;
* ``grain-threads``: a grain pipeline (``grain.MapDataset`` of the loader's rows, read through the same
  source with the same order and keys) on ``workers`` grain threads (``ReadOptions``), batched after;
* ``grain-processes``: the same rows batched in ``workers`` grain worker processes (``mp_prefetch``), each
  building its own copy of the source; needs ``pip install 'snnjax[grain]'``.

Every loader's batches are checked equal to the first's (``same_batches``). Event datasets are read twice:
``cold`` decodes, integrates and writes the frame cache (DVS128 Gesture, N-Caltech101), or first copies the
HDF5 spikes to their memory-mapped copy (SHD/SSC: ``setup_s``, outside samples/s), and ``warm`` reads the
cache (each worker count and loader starts from an empty cache). ``samples_per_s`` spans the epoch,
``first_batch_s`` the wait for its first batch (worker processes start and import snnjax then),
``steady_samples_per_s`` the rest. Records carry the 1, 5 and 15-minute load averages at the start of the
epoch. Generated sizes per example: DVS128 Gesture 200,000 events (AEDAT 3.1, 1.6 MB), N-Caltech101 100,000
events (ATIS, 500 kB), SHD/SSC 6,000 spikes, image folder 500x375 JPEG (quality 90). ``--out`` appends one
JSON line per measurement.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from snnjax.bench import data_formats as fmt
from snnjax.data import Loader
from snnjax.data.registry import get_source

EVENTS_PER_GESTURE = 200_000
EVENTS_PER_NCALTECH = 100_000
SPIKES_PER_SAMPLE = 6_000
IMAGE_SIZE = (375, 500)  # rows, columns


def generate(dataset: str, root: Path, examples: int, seed: int = 0) -> None:
    """Writes ``examples`` training examples of ``dataset`` (and a few test ones) under ``root``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    if dataset == "dvs128_gesture":
        folder = root / "DvsGesture"
        folder.mkdir(parents=True)
        names = []
        for r in range(-(-examples // 11)):
            windows, start = [], 1_000_000
            for c in range(1, min(11, examples - 11 * r) + 1):
                windows.append((c, start, start + 6_000_000))
                start += 6_500_000
            name = f"user{r + 1:02d}_fluorescent"
            fmt.write_gesture_recording(folder, name, windows, EVENTS_PER_GESTURE, rng)
            names.append(name)
        (folder / "trials_to_train.txt").write_text("".join(f"{n}.aedat\n" for n in names))
        (folder / "trials_to_test.txt").write_text(f"{names[0]}.aedat\n")
    elif dataset == "ncaltech101":
        for k in range(examples):
            folder = root / "Caltech101" / f"class{k % 4}"
            folder.mkdir(parents=True, exist_ok=True)
            t = np.sort(rng.integers(0, 300_000, EVENTS_PER_NCALTECH))
            n = t.shape[0]
            (folder / f"image_{k:04d}.bin").write_bytes(
                fmt.atis_bytes(t, rng.integers(0, 240, n), rng.integers(0, 180, n), rng.integers(0, 2, n)))
    elif dataset in ("shd", "ssc"):
        classes = 20 if dataset == "shd" else 35
        for split in ("train", "test", "valid") if dataset == "ssc" else ("train", "test"):
            count = examples if split == "train" else 4
            spikes = [fmt.random_spikes(rng, SPIKES_PER_SAMPLE) for _ in range(count)]
            fmt.write_heidelberg_h5(root / f"{dataset}_{split}.h5", [s[0] for s in spikes], [s[1] for s in spikes],
                                    rng.integers(0, classes, count))
    elif dataset == "image_folder":
        from PIL import Image  # noqa: PLC0415

        for split, count in (("train", examples), ("val", 4)):
            for k in range(count):
                folder = root / split / f"n{k % 4:08d}"
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(fmt.smooth_image(rng, *IMAGE_SIZE)).save(folder / f"img_{k:05d}.JPEG", quality=90)
    else:
        raise ValueError(f"no generator for dataset {dataset!r}")


LOADERS = ("snnjax", "grain-threads", "grain-processes")


class GrainRows:
    """grain's map function: row ``r`` of epoch 0 -> ``(inputs, label)`` of row ``r % B`` of :class:`Loader`'s step
    ``r // B`` (its order and augmentation keys), read through a source made by ``make_source`` (in each worker
    process, where none is given)."""

    def __init__(self, make_source, batch_size: int, source=None):
        self.make_source, self.batch_size = make_source, batch_size
        self._loader = None if source is None else self._make_loader(source)

    def _make_loader(self, source) -> Loader:
        return Loader(source, self.batch_size, seed=0, process_index=0, process_count=1, prefetch=0)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_loader": None}

    def __call__(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        if self._loader is None:
            self._loader = self._make_loader(self.make_source())
        step, j = divmod(int(row), self.batch_size)
        indices, _ = self._loader.step_indices(0, step)
        inputs, labels = self._loader.source.read(indices[j:j + 1], self._loader.example_keys(0, step)[j:j + 1])
        return inputs[0], labels[0]


def stack_rows(rows: list[tuple[np.ndarray, np.ndarray]], time_major: bool) -> dict[str, np.ndarray]:
    """grain's batch function: the rows as :class:`Loader`'s batch (time first for event frames)."""
    inputs = np.stack([r[0] for r in rows])
    if time_major:  # [b, T, ...] -> [T, b, ...]
        inputs = np.ascontiguousarray(np.moveaxis(inputs, 1, 0))
    return {"inputs": inputs, "labels": np.asarray([r[1] for r in rows], np.int32),
            "mask": np.ones(len(rows), bool)}


def grain_batches(make_source, source, batch_size: int, kind: str, workers: int):
    """One epoch of the loader's batches from grain: ``workers`` threads reading rows, or worker processes
    reading whole batches."""
    try:
        import grain  # noqa: PLC0415 (an optional extra)
    except ImportError as err:
        raise ImportError("grain is not installed: pip install 'snnjax[grain]', or measure --loaders snnjax") from err
    from absl import flags  # noqa: PLC0415 (grain's worker processes read absl flags)

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    steps = len(source) // batch_size
    stack = functools.partial(stack_rows, time_major=source.time_steps is not None)
    if kind == "grain-threads":
        rows = grain.MapDataset.range(steps * batch_size).map(GrainRows(make_source, batch_size, source))
        reading = grain.ReadOptions(num_threads=workers, prefetch_buffer_size=2 * batch_size)
        return iter(rows.to_iter_dataset(reading).batch(batch_size, batch_fn=stack))
    rows = grain.MapDataset.range(steps * batch_size).map(GrainRows(make_source, batch_size))
    batches = rows.batch(batch_size, batch_fn=stack).to_iter_dataset(
        grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
    return iter(batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2)))


def read_epoch(batches, batch_size: int) -> tuple[dict, list[str]]:
    """Rates of one epoch of ``batches`` and a digest of each batch."""
    start = time.perf_counter()
    count, first, digests = 0, None, []
    for batch in batches:
        first = time.perf_counter() if first is None else first
        count += batch["labels"].shape[0]
        digests.append(hashlib.sha1(b"".join(np.ascontiguousarray(batch[k]).tobytes()
                                             for k in ("inputs", "labels", "mask"))).hexdigest())
    end = time.perf_counter()
    rest = count - batch_size
    return {"samples_per_s": round(count / (end - start), 2), "first_batch_s": round(first - start, 3),
            "steady_samples_per_s": round(rest / (end - first), 2) if rest else None}, digests


def measure(dataset: str, root: Path, batch_size: int, time_steps: int, workers: int,
            loaders: tuple[str, ...] = LOADERS) -> list[dict]:
    """Records per loader (:data:`LOADERS`) and phase: ``cold`` (no cache yet: the event-camera datasets build
    their frame cache during the epoch, SHD/SSC copy their spikes when the source is built, ``setup_s``) then
    ``warm``; image folders, which cache nothing, one ``read``. ``workers``: the ``num_workers`` option
    (snnjax's decoding threads), grain's threads or its worker processes."""
    options: dict = {}
    if dataset in ("dvs128_gesture", "ncaltech101"):
        options.update(size=48 if dataset == "ncaltech101" else 128, flip=True, translate=4, cache_dir=str(root))
    elif dataset == "image_folder":
        options.update(size=224)
    kwargs = {"time_steps": time_steps} if dataset != "image_folder" else {}
    records, reference = [], {}
    for loader in loaders:
        for cache_dir in [*root.glob("frames_*"), *root.glob("*.spikes")]:
            shutil.rmtree(cache_dir)
        threads = workers if loader == "snnjax" else 1
        make_source = functools.partial(get_source, dataset, "train", data_dir=root, num_workers=threads, **kwargs,
                                        **options)
        for phase in ("cold", "warm") if dataset != "image_folder" else ("read",):
            start = time.perf_counter()
            source = make_source()
            setup = time.perf_counter() - start
            load = os.getloadavg()
            if loader == "snnjax":
                batches = Loader(source, batch_size, seed=0, process_index=0, process_count=1,
                                 prefetch=2).epoch_batches(0)
            else:
                batches = grain_batches(make_source, source, batch_size, loader, workers)
            rates, digests = read_epoch(batches, batch_size)
            same = reference.setdefault(phase, digests) == digests
            records.append({"bench": "data", "dataset": dataset, "loader": loader, "phase": phase,
                            "workers": workers, "examples": len(source), "batch_size": batch_size,
                            "example_shape": list(source.example_shape), **rates, "same_batches": same,
                            "setup_s": round(setup, 3), "load_avg": round(load[0], 2),
                            "load_avg_5_15": [round(x, 2) for x in load[1:]], "cpus": os.cpu_count()})
            print(json.dumps(records[-1]), flush=True)
            if not same:
                raise AssertionError(f"{loader} read other batches than {loaders[0]} ({dataset}, {phase})")
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True,
                        choices=("dvs128_gesture", "ncaltech101", "shd", "ssc", "image_folder"))
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--time-steps", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS))
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temporary folder)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix=f"snnjax-{args.dataset}-"))
    try:
        start = time.perf_counter()
        generate(args.dataset, root, args.examples)
        print(f"generated {args.examples} examples in {time.perf_counter() - start:.1f} s under {root}", flush=True)
        records = [r for w in args.workers for r in measure(args.dataset, root, args.batch_size, args.time_steps, w,
                                                             tuple(args.loaders))]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if args.out:
            with open(args.out, "a") as f:
                for record in records:
                    f.write(json.dumps({**record, "timestamp": stamp}) + "\n")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
