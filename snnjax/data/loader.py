"""A deterministic, per-process batcher over a :class:`~snnjax.data.source.Source`.

The order of an epoch is a pure function of ``(seed, epoch)``:
``np.random.default_rng([seed, epoch]).permutation(len(source))`` (or
``arange`` without shuffling). Global batch ``s`` of an epoch is positions
``[s * B, (s + 1) * B)`` of that order; process ``k`` of ``P`` reads only its
contiguous slice ``[k * B / P, (k + 1) * B / P)`` of it, so the processes'
slices, concatenated in process order, are the global batch (the layout
``jax.make_array_from_process_local_data`` expects for a batch axis sharded
over all devices in process order). Starting at ``start_step`` reads nothing
before that step, which makes resuming from a checkpoint exact.

Each batch is a dict of numpy arrays, time-major as the library expects:

* ``inputs``: static images ``[b, H, W, C]`` (an encoder adds ``T``), or event
  frames ``[T, b, H, W, 2]``;
* ``labels``: ``[b]`` int32;
* ``mask``: ``[b]`` bool, False on padding. With ``drop_remainder=False`` the
  last, partial global batch is padded to the full size (repeating the
  epoch's first example) so every step has the same shapes on every process.

Each row is read with an augmentation key ``(seed, epoch, position in the
epoch)`` (:meth:`Loader.example_keys`); sources that augment their training
split draw from ``np.random.default_rng(key)``, so augmentation too is a pure
function of the step, whatever the process count.

``b = global_batch_size // process_count`` is the local batch size. Given the
sharding of the batch axis instead (``batch_sharding``), the process reads the
rows its devices hold: with the batch axes spanning all processes that is
slice ``k`` of ``P`` as above; where several processes hold the same rows (a
model axis across processes) they read the same, larger slice.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from snnjax.data.prefetch import prefetch as prefetch_iterator
from snnjax.data.source import Source

Batch = dict[str, np.ndarray]


class Loader:
    """Batches of ``source`` for this process, deterministic in ``(seed, epoch, step)``.

    Args:
      source: the dataset.
      global_batch_size: examples per step over all processes; must divide by
        ``process_count``.
      seed: shuffling seed.
      shuffle: permute each epoch (else dataset order).
      drop_remainder: drop the last partial global batch (training); else pad
        it and mark the padding in ``mask`` (evaluation).
      process_index, process_count: this process's slice of each global batch and the
        number of slices (default ``jax.process_index()`` / ``jax.process_count()``).
      batch_sharding: instead of those two, the sharding of a global batch's batch
        axis (rank 1, e.g. ``snnjax.parallel.mesh.batch_sharding(mesh, 1)``); the
        process reads the rows its devices hold under it.
      prefetch: batches to prepare ahead in a background thread (0: none).
    """

    def __init__(self, source: Source, global_batch_size: int, *, seed: int = 0,
                 shuffle: bool = True, drop_remainder: bool = True,
                 process_index: int | None = None, process_count: int | None = None,
                 batch_sharding=None, prefetch: int = 2):
        if batch_sharding is not None:
            if process_index is not None or process_count is not None:
                raise ValueError("give batch_sharding or process_index / process_count, not both")
            process_index, process_count = process_slice(batch_sharding, global_batch_size)
        if process_index is None or process_count is None:
            import jax  # noqa: PLC0415 (the loader itself runs without jax)

            process_index = jax.process_index() if process_index is None else process_index
            process_count = jax.process_count() if process_count is None else process_count
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ValueError(f"need 0 <= process_index < process_count, got "
                             f"{process_index} and {process_count}")
        if global_batch_size < 1 or global_batch_size % process_count:
            raise ValueError(f"global_batch_size={global_batch_size} must be a positive multiple of "
                             f"process_count={process_count}: each process reads an equal slice of every batch; "
                             f"pass Loader(global_batch_size=...) a multiple of {process_count} "
                             "(train.py: --config.global_batch_size)")
        n = len(source)
        steps = n // global_batch_size if drop_remainder else -(-n // global_batch_size)
        if steps == 0:
            raise ValueError(f"dataset of {n} examples gives no batch of {global_batch_size} "
                             f"(drop_remainder={drop_remainder})")
        self.source = source
        self.global_batch_size = int(global_batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_remainder = drop_remainder
        self.process_index = int(process_index)
        self.process_count = int(process_count)
        self.prefetch = int(prefetch)
        self.local_batch_size = self.global_batch_size // self.process_count
        self.steps_per_epoch = steps

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The global example order ``[len(source)]`` of ``epoch``."""
        n = len(self.source)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, int(epoch)]).permutation(n)

    def _local_indices(self, order: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        positions = self._positions(step)
        valid = positions < order.shape[0]
        return order[np.where(valid, positions, 0)], valid

    def _positions(self, step: int) -> np.ndarray:
        start = step * self.global_batch_size + self.process_index * self.local_batch_size
        return np.arange(start, start + self.local_batch_size)

    def example_keys(self, epoch: int, step: int) -> np.ndarray:
        """``[b, 3]`` int64 ``(seed, epoch, position in the epoch)``: the augmentation key of each local row.

        A row's key depends on where its example falls in the epoch, not on the process count, so
        an example is augmented alike however the batch is split and after a resume.
        """
        positions = self._positions(step)
        return np.stack([np.full_like(positions, self.seed), np.full_like(positions, int(epoch)), positions], 1)

    def step_indices(self, epoch: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """This process's ``(indices [b], mask [b])`` for ``step`` of ``epoch``."""
        if not 0 <= step < self.steps_per_epoch:
            raise ValueError(f"step {step} outside [0, {self.steps_per_epoch})")
        return self._local_indices(self.epoch_order(epoch), step)

    def _make_batch(self, indices: np.ndarray, mask: np.ndarray, keys: np.ndarray | None = None) -> Batch:
        inputs, labels = self.source.read(indices, keys)
        if self.source.time_steps is not None:  # [b, T, ...] -> [T, b, ...]
            inputs = np.ascontiguousarray(np.moveaxis(inputs, 1, 0))
        return {"inputs": inputs, "labels": labels, "mask": mask}

    def _epoch_batches(self, epoch: int, start_step: int) -> Iterator[Batch]:
        order = self.epoch_order(epoch)
        for step in range(start_step, self.steps_per_epoch):
            yield self._make_batch(*self._local_indices(order, step), self.example_keys(epoch, step))

    def epoch_batches(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        """This process's batches of ``epoch`` from ``start_step`` (skipped steps are not read)."""
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step {start_step} outside [0, {self.steps_per_epoch}]")
        return prefetch_iterator(self._epoch_batches(epoch, start_step), self.prefetch)

    def _batches(self, start_step: int) -> Iterator[Batch]:
        epoch, step = divmod(start_step, self.steps_per_epoch)
        while True:
            yield from self._epoch_batches(epoch, step)
            epoch, step = epoch + 1, 0

    def batches(self, start_step: int = 0) -> Iterator[Batch]:
        """Endless batches across epochs from global step ``start_step`` (epoch = step // steps_per_epoch)."""
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        return prefetch_iterator(self._batches(start_step), self.prefetch)


def process_slice(batch_sharding, global_batch_size: int) -> tuple[int, int]:
    """``(k, n)``: this process's devices hold slice ``k`` of ``n`` of a global batch under ``batch_sharding``.

    ``batch_sharding`` shards a rank-1 array of ``global_batch_size`` rows (the batch axis).
    Error if this process holds no rows or rows that are not one aligned, contiguous slice
    (devices not in process order).
    """
    import jax  # noqa: PLC0415 (as in Loader: the loader itself runs without jax)

    held = batch_sharding.addressable_devices_indices_map((global_batch_size,)).values()
    rows = sorted({(index[0].start or 0, global_batch_size if index[0].stop is None else index[0].stop)
                   for index in held})
    if not rows:
        raise ValueError(f"process {jax.process_index()} has no device in the batch sharding; build the mesh over "
                         "every process's devices (jax.devices())")
    start, stop = rows[0][0], rows[-1][1]
    size = stop - start
    contiguous = all(a[1] == b[0] for a, b in zip(rows, rows[1:], strict=False))
    if not contiguous or start % size or global_batch_size % size:
        raise ValueError(f"the devices of process {jax.process_index()} hold rows {rows} of a batch of "
                         f"{global_batch_size}, not one aligned contiguous slice; order the mesh's devices by "
                         "process (as jax.devices() is) with the batch axes outermost")
    return start // size, global_batch_size // size
