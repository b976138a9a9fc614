"""Random-access dataset sources.

A source is a finite, indexable collection of labelled examples. The batcher
(:mod:`snnjax.data.loader`) asks it for examples by an index array and gets
numpy arrays back:

* static-image sources: ``inputs`` ``[n, H, W, C]`` float32 in ``[0, 1]``;
* event sources: ``inputs`` ``[n, T, H, W, 2]`` float32 event counts per
  (frame, y, x, polarity), with a per-example time axis (the batcher moves
  time first);
* ``labels`` ``[n]`` int32 class indices in ``[0, num_classes)``.
"""
from __future__ import annotations

import abc

import numpy as np


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
