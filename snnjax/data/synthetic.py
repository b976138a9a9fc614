"""Synthetic DVS-like event frames with CIFAR10-DVS shapes, for benchmarks and smoke tests.

Example ``i`` of a split is a blob that moves across the frame along a
class-dependent direction (class ``c`` moves at angle ``2 pi c / num_classes``)
with a per-example random offset and speed. Its frames ``[T, H, W, 2]`` hold
Poisson event counts: channel 1 (ON) follows the blob's position at step
``t + 1``, channel 0 (OFF) its position at step ``t``, plus sparse background
noise. Everything is a pure function of ``(seed, split, i)``; labels are
``i % num_classes``. No files are read or written.
"""
from __future__ import annotations

import numpy as np

from snnjax.data.source import Source

_SPLIT_IDS = {"train": 0, "test": 1}


class SyntheticDVSSource(Source):
    """Deterministic class-dependent event frames ``[n, T, H, W, 2]`` float32 (counts).

    Args:
      split: ``"train"`` or ``"test"`` (independent example streams).
      num_examples: examples in the split (default 9000 train / 1000 test, as CIFAR10-DVS 0.9).
      time_steps: ``T``.
      size: ``(H, W)`` or an int (default 48, CIFAR10DVSVGG's input).
      num_classes: number of classes.
      seed: generator seed.
      peak_rate: expected events per pixel and step at the blob centre.
      noise_rate: expected background events per pixel, step and polarity.
    """

    def __init__(self, split: str = "train", *, num_examples: int | None = None,
                 time_steps: int = 10, size: int | tuple[int, int] = 48, num_classes: int = 10,
                 seed: int = 0, peak_rate: float = 2.0, noise_rate: float = 0.02):
        if split not in _SPLIT_IDS:
            raise ValueError(f"synthetic_dvs split must be one of {tuple(_SPLIT_IDS)}, got {split!r}")
        if isinstance(size, int):
            size = (size, size)
        self.split = split
        self._num_examples = int(num_examples if num_examples is not None
                                 else (9000 if split == "train" else 1000))
        self.time_steps = int(time_steps)
        self.size = (int(size[0]), int(size[1]))
        self.num_classes = int(num_classes)
        self.seed = int(seed)
        self.peak_rate = float(peak_rate)
        self.noise_rate = float(noise_rate)
        self.example_shape = (self.time_steps, *self.size, 2)

    def __len__(self) -> int:
        return self._num_examples

    def example(self, index: int) -> tuple[np.ndarray, int]:
        """Frames ``[T, H, W, 2]`` float32 and label of example ``index``."""
        label = index % self.num_classes
        rng = np.random.default_rng([self.seed, _SPLIT_IDS[self.split], index])
        height, width = self.size
        steps = self.time_steps
        angle = 2.0 * np.pi * label / self.num_classes
        direction = np.array([np.sin(angle), np.cos(angle)])  # (row, col)
        centre = np.array([height, width]) / 2.0 + rng.uniform(-0.1, 0.1, 2) * np.array([height, width])
        span = 0.6 * min(height, width) * rng.uniform(0.8, 1.2)
        progress = np.linspace(-0.5, 0.5, steps + 1)
        path = centre[None, :] + progress[:, None] * span * direction[None, :]  # [T+1, 2]
        sigma = 0.08 * min(height, width)
        rows = np.arange(height)[None, :, None]
        cols = np.arange(width)[None, None, :]
        blob = np.exp(-((rows - path[:, 0, None, None]) ** 2 + (cols - path[:, 1, None, None]) ** 2)
                      / (2.0 * sigma ** 2))  # [T+1, H, W]
        rate = np.stack([blob[:-1], blob[1:]], axis=-1) * self.peak_rate + self.noise_rate
        return rng.poisson(rate).astype(np.float32), label

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        examples = [self.example(int(i)) for i in indices]
        return (np.stack([frames for frames, _ in examples]),
                np.asarray([label for _, label in examples], np.int32))
