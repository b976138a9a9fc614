"""Random-access dataset sources.

A source is a finite, indexable collection of labelled examples. The batcher
(:mod:`snnjax.data.loader`) asks it for examples by an index array and gets
numpy arrays back:

* static-image sources: ``inputs`` ``[n, H, W, C]`` float32 in ``[0, 1]``;
* event sources: ``inputs`` ``[n, T, H, W, 2]`` float32 event counts per
  (frame, y, x, polarity), with a per-example time axis (the batcher moves
  time first);
* ``labels`` ``[n]`` int32 class indices in ``[0, num_classes)``.

:class:`OnCorrupt` wraps a source to say what an example that fails to read
(a corrupt file) does: stop the read with the reader's error, or be skipped.
"""
from __future__ import annotations

import abc
import threading
import warnings

import numpy as np

ON_CORRUPT = ("error", "skip")  # config.data.on_corrupt
# What the readers raise for a file they cannot use (docs/files.md): ValueError naming the file and what is
# wrong, OSError for one that cannot be read at all (gone, unreadable).
CORRUPT_ERRORS = (ValueError, OSError)


class Source(abc.ABC):
    """A random-access labelled dataset.

    Attributes:
      num_classes: number of classes; labels lie in ``[0, num_classes)``.
      example_shape: shape of one input example: ``(H, W, C)`` for static
        images, ``(T, H, W, 2)`` for event frames.
      time_steps: ``None`` for static images; ``T`` (the leading axis of
        ``example_shape``) for sources whose examples carry their own time axis.
    """

    num_classes: int
    example_shape: tuple[int, ...]
    time_steps: int | None = None

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of examples."""

    @abc.abstractmethod
    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reads examples at validated int64 ``indices`` ``[n]``."""

    def _read_keyed(self, indices: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reads examples with per-example random keys; sources that augment override this."""
        return self._read(indices)

    def read(self, indices, keys=None) -> tuple[np.ndarray, np.ndarray]:
        """Returns ``(inputs [n, *example_shape] float32, labels [n] int32)``.

        Args:
          indices: integer array-like ``[n]`` of example indices in
            ``[0, len(self))``; duplicates are allowed, order is kept.
          keys: optional int64 ``[n, k]``: example ``i``'s augmentation draws come from
            ``np.random.default_rng(keys[i])`` (the loader passes ``(seed, epoch, position)``);
            ``None`` reads without augmentation.
        """
        indices = np.asarray(indices)
        if indices.ndim != 1 or not (indices.size == 0 or np.issubdtype(indices.dtype, np.integer)):
            raise ValueError(f"indices must be a 1-D integer array, got {indices.dtype} {indices.shape}")
        indices = indices.astype(np.int64)
        n = len(self)
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            raise IndexError(f"indices out of range [0, {n}): min {indices.min()}, max {indices.max()}")
        if indices.size == 0:
            return (np.zeros((0, *self.example_shape), np.float32), np.zeros((0,), np.int32))
        if keys is None:
            inputs, labels = self._read(indices)
        else:
            keys = np.asarray(keys, np.int64)
            if keys.ndim != 2 or keys.shape[0] != indices.shape[0] or (keys.size and keys.min() < 0):
                raise ValueError(f"keys must be non-negative int64 [{indices.shape[0]}, k], got {keys.shape}")
            inputs, labels = self._read_keyed(indices, keys)
        return inputs.astype(np.float32, copy=False), labels.astype(np.int32, copy=False)


class ArraySource(Source):
    """A source over in-memory arrays.

    Args:
      inputs: ``[n, *example_shape]`` float32 (images ``[n, H, W, C]`` in [0, 1]).
      labels: ``[n]`` integer class indices.
      num_classes: number of classes.
      time_steps: ``None`` for static images, ``T`` if ``inputs`` is ``[n, T, ...]``.
    """

    def __init__(self, inputs: np.ndarray, labels: np.ndarray, num_classes: int,
                 time_steps: int | None = None):
        inputs = np.asarray(inputs, np.float32)
        labels = np.asarray(labels, np.int32)
        if inputs.shape[0] != labels.shape[0] or labels.ndim != 1:
            raise ValueError(f"inputs {inputs.shape} and labels {labels.shape} disagree")
        if time_steps is not None and inputs.shape[1] != time_steps:
            raise ValueError(f"time_steps={time_steps} but inputs have shape {inputs.shape}")
        self._inputs = inputs
        self._labels = labels
        self.num_classes = int(num_classes)
        self.example_shape = tuple(inputs.shape[1:])
        self.time_steps = time_steps

    def __len__(self) -> int:
        return self._labels.shape[0]

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._inputs[indices], self._labels[indices]


class OnCorrupt(Source):
    """``source``, with a policy for examples that fail to read (the readers' ``CORRUPT_ERRORS``, naming the file).

    ``"error"``: the read stops with a ``ValueError`` carrying the reader's message and how to skip such examples.
    ``"skip"``: a failing example is replaced in its batch by the next example of the dataset (index ``i + 1``,
    ``i + 2``, ..., wrapping around) that reads, with a ``RuntimeWarning`` naming it the first time; every index
    found corrupt is kept in ``corrupt`` (index: the error's message). The replacement depends only on which files
    are corrupt, so a resumed run reads the same batches. A batch reads whole first; only a batch that fails is
    read again example by example. Up to ``MAX_SEARCH`` examples in a row may fail; more is not a corrupt file but
    an unreadable dataset, and raises the error.

    Args:
      source: the dataset.
      on_corrupt: ``"error"`` or ``"skip"``.
      what: the dataset's name and split for the messages (``"cifar10dvs training"``).
    """

    MAX_SEARCH = 64

    def __init__(self, source: Source, on_corrupt: str = "error", *, what: str = "data"):
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt={on_corrupt!r} is not allowed; choose one of {list(ON_CORRUPT)} "
                             "(config.data.on_corrupt)")
        self.source, self.on_corrupt, self.what = source, on_corrupt, what
        self.num_classes, self.example_shape = source.num_classes, source.example_shape
        self.time_steps = source.time_steps
        self.corrupt: dict[int, str] = {}
        self._lock = threading.Lock()  # the loader's prefetch thread and the main thread may both read

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name: str):  # the wrapped source's own attributes (``files``, ...)
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read_keyed(indices, None)

    def _read_keyed(self, indices: np.ndarray, keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            known = list(self.corrupt)
        try:
            if not known or not np.isin(indices, known).any():
                return self.source.read(indices, keys)
        except CORRUPT_ERRORS as e:
            if self.on_corrupt == "error":
                raise ValueError(f"{e} (a {self.what} example; config.data.on_corrupt='skip' skips such examples "
                                 "with a warning)") from e
        rows = [self._read_one(int(i), None if keys is None else keys[r:r + 1]) for r, i in enumerate(indices)]
        return np.concatenate([x for x, _ in rows]), np.concatenate([y for _, y in rows])

    def _read_one(self, index: int, key: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Example ``index``, or the next one that reads in its place."""
        n, first = len(self.source), None
        for offset in range(min(self.MAX_SEARCH, n)):
            i = (index + offset) % n
            with self._lock:
                if i in self.corrupt:
                    continue
            try:
                return self.source.read(np.array([i]), key)
            except CORRUPT_ERRORS as e:
                first = first or e
                with self._lock:
                    known = i in self.corrupt
                    self.corrupt[i] = str(e)
                if not known:
                    warnings.warn(f"skipping a corrupt {self.what} example (config.data.on_corrupt='skip'): {e}",
                                  RuntimeWarning, stacklevel=2)
        raise ValueError(f"{min(self.MAX_SEARCH, n)} {self.what} examples in a row from index {index} fail to read, "
                         f"which is not a corrupt file but an unreadable dataset; the first error: {first}") from first
