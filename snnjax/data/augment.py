"""Per-example event-frame augmentations, drawn from a generator the loader keys by (seed, epoch, position).

DVS recipes flip frames horizontally and shift them by a few pixels (torchvision's
``RandomHorizontalFlip`` and ``RandomCrop(size, padding=k)`` on SpikingJelly's frames). Here both
act on one example's frames ``[T, H, W, C]``, the same draw for every time step.
"""
from __future__ import annotations

import dataclasses

import numpy as np


def shift_frames(frames: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``frames [..., H, W, C]`` moved ``dy`` rows down and ``dx`` columns right, zeros where nothing moved in.

    Equal to zero-padding by ``|dy|``, ``|dx|`` and cropping the original size at the shifted corner.
    """
    h, w = frames.shape[-3], frames.shape[-2]
    out = np.zeros_like(frames)
    if abs(dy) >= h or abs(dx) >= w:
        return out
    src_y, dst_y = slice(max(0, -dy), h - max(0, dy)), slice(max(0, dy), h - max(0, -dy))
    src_x, dst_x = slice(max(0, -dx), w - max(0, dx)), slice(max(0, dx), w - max(0, -dx))
    out[..., dst_y, dst_x, :] = frames[..., src_y, src_x, :]
    return out


@dataclasses.dataclass(frozen=True)
class EventAugment:
    """Random horizontal flip (probability 1/2) and random translation by up to ``translate`` pixels.

    Draws, in order: one uniform for the flip (if ``flip``), then ``dy`` and ``dx`` uniform in
    ``[-translate, translate]`` (if ``translate > 0``).
    """

    flip: bool = False
    translate: int = 0

    def __post_init__(self):
        if self.translate < 0:
            raise ValueError(f"translate must be >= 0 pixels, got {self.translate}")

    @property
    def active(self) -> bool:
        return self.flip or self.translate > 0

    def __call__(self, frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One example's frames ``[T, H, W, C]`` augmented with draws from ``rng``."""
        if self.flip and rng.random() < 0.5:
            frames = frames[..., ::-1, :]
        if self.translate > 0:
            dy, dx = rng.integers(-self.translate, self.translate + 1, size=2)
            frames = shift_frames(frames, int(dy), int(dx))
        return np.ascontiguousarray(frames)
