"""Per-example frame augmentations, drawn from a generator the loader keys by (seed, epoch, position).

DVS recipes flip frames horizontally and shift them by a few pixels (torchvision's
``RandomHorizontalFlip`` and ``RandomCrop(size, padding=k)`` on SpikingJelly's frames). SpikingJelly's
CIFAR10-DVS recipe (``activation_based/examples/memopt``) adds a nearest-neighbour
``RandomResizedCrop(scale=(s, 1))`` and its ``CIFAR10DVSNDA``: one of a wrap-around roll, a rotation
(nearest) and a cutout square per example. SEW ResNet's recipe drops frames at random
(``spikingjelly.datasets.RandomTemporalDelete``). Here each acts on one example's frames
``[T, H, W, C]`` (``[T, F]`` for the temporal delete alone), the same spatial draw for every time step.
"""
from __future__ import annotations

import abc
import dataclasses
import math

import numpy as np

from snnjax.data.source import Source


def random_resized_crop_box(height: int, width: int, rng: np.random.Generator, scale=(0.08, 1.0),
                            ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop as torchvision's ``RandomResizedCrop.get_params``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


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


def resized_crop_frames(frames: np.ndarray, top: int, left: int, h: int, w: int) -> np.ndarray:
    """The window ``[top:top+h, left:left+w]`` of ``frames [..., H, W, C]`` resized back to ``H x W``, nearest
    neighbour as torch's ``interpolate(mode="nearest")``: output row ``i`` reads window row ``floor(i * h / H)``."""
    height, width = frames.shape[-3], frames.shape[-2]
    rows = top + np.minimum(np.floor(np.arange(height) * (h / height)).astype(np.int64), h - 1)
    cols = left + np.minimum(np.floor(np.arange(width) * (w / width)).astype(np.int64), w - 1)
    return frames[..., rows[:, None], cols[None, :], :]


def rotate_frames(frames: np.ndarray, degrees: float) -> np.ndarray:
    """``frames [..., H, W, C]`` rotated ``degrees`` counter-clockwise about the image centre, nearest neighbour,
    zeros outside, as torchvision's ``rotate(NEAREST, expand=False)`` on a tensor.

    Output pixel ``(y, x)``, at ``(u, v) = (x + 1/2 - W/2, y + 1/2 - H/2)`` from the centre, reads input column
    ``rint(cos(a) u - sin(a) v + W/2 - 1/2)`` and row ``rint(sin(a) u + cos(a) v + H/2 - 1/2)``.
    """
    height, width = frames.shape[-3], frames.shape[-2]
    a = math.radians(degrees)
    v, u = np.meshgrid(np.arange(height) + 0.5 - height / 2, np.arange(width) + 0.5 - width / 2, indexing="ij")
    cols = np.rint(math.cos(a) * u - math.sin(a) * v + width / 2 - 0.5).astype(np.int64)
    rows = np.rint(math.sin(a) * u + math.cos(a) * v + height / 2 - 0.5).astype(np.int64)
    inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    out = frames[..., np.where(inside, rows, 0), np.where(inside, cols, 0), :]
    return np.where(inside[:, :, None], out, 0).astype(frames.dtype, copy=False)


def cutout_frames(frames: np.ndarray, y: int, x: int, length: int) -> np.ndarray:
    """``frames [..., H, W, C]`` with rows ``[y - length//2, y + length//2)`` x the same columns around ``x`` (clipped
    to the image) set to zero, as the Cutout of SpikingJelly's CIFAR10-DVS recipe."""
    height, width = frames.shape[-3], frames.shape[-2]
    out = frames.copy()
    half = length // 2
    out[..., max(y - half, 0):min(y + half, height), max(x - half, 0):min(x + half, width), :] = 0
    return out


def temporal_delete_indices(time_steps: int, remain: int, rng: np.random.Generator) -> np.ndarray:
    """``[remain]`` sorted distinct frame indices in ``[0, time_steps)``, drawn without replacement."""
    return np.sort(rng.choice(time_steps, remain, replace=False))


@dataclasses.dataclass(frozen=True)
class EventAugment:
    """Random frame augmentations of one training example; each is off at its default.

    Attributes (the dataset option of the same name, ``data.options.<name>`` in a config):
      crop_scale: in (0, 1]: a random-resized crop of ``scale=(crop_scale, 1)``, ratio ``(3/4, 4/3)``, resized back
        to ``H x W`` (nearest).
      flip: horizontal flip with probability 1/2.
      translate: shift by ``dy, dx`` uniform in ``[-translate, translate]`` pixels, zero fill.
      roll: shift by ``dy, dx`` uniform in ``[-roll, roll]``, wrapping around (``torch.roll``).
      rotate: rotate by an angle uniform in ``[-rotate, rotate]`` degrees (nearest, zero fill).
      cutout: zero one square of side ``cutout`` (about a uniformly drawn centre pixel).
      nda: apply one of the enabled ``roll`` / ``rotate`` / ``cutout``, picked uniformly per example (SpikingJelly's
        ``CIFAR10DVSNDA(M=1, N)``: ``roll=2N+1, rotate=15N, cutout=8N``), instead of each.
      temporal_delete: keep this many of the ``T`` frames, a sorted random subset (SpikingJelly's
        ``RandomTemporalDelete(T_remain)``): the model then sees ``temporal_delete`` time steps in training.

    Draws, in this order, only for the augmentations that are on: the crop box (torchvision's ``get_params``), one
    uniform for the flip, ``dy, dx`` of the translation; then (``nda``) the choice, or each of roll ``dy, dx``,
    the angle, the cutout centre ``y, x``; last the kept frames (``Generator.choice`` without replacement).
    """

    crop_scale: float = 1.0
    flip: bool = False
    translate: int = 0
    roll: int = 0
    rotate: float = 0.0
    cutout: int = 0
    nda: bool = False
    temporal_delete: int = 0

    def __post_init__(self):
        for name in ("translate", "roll", "cutout", "temporal_delete"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r} "
                                 f"(data.options.{name} / {name}=)")
        if self.rotate < 0:
            raise ValueError(f"rotate must be >= 0 degrees, got {self.rotate} (data.options.rotate / rotate=)")
        if not 0.0 < self.crop_scale <= 1.0:
            raise ValueError(f"crop_scale must be in (0, 1], got {self.crop_scale} (data.options.crop_scale / "
                             "crop_scale=)")
        if self.nda and not self._nda_ops():
            raise ValueError("nda=True picks one of roll / rotate / cutout per example, but none is set: set them "
                             "(data.options.roll / rotate / cutout, or roll= rotate= cutout=); SpikingJelly's "
                             "CIFAR10DVSNDA(M=1, N=2) is roll=5, rotate=30, cutout=16")

    @property
    def active(self) -> bool:
        return (self.crop_scale < 1.0 or self.flip or self.translate > 0 or bool(self._nda_ops())
                or self.temporal_delete > 0)

    @property
    def spatial(self) -> bool:
        """Whether any augmentation besides the temporal delete is on (those need frames ``[T, H, W, C]``)."""
        return dataclasses.replace(self, temporal_delete=0).active

    def time_steps(self, frame_steps: int) -> int:
        """The time steps of an augmented example built with ``frame_steps`` frames.

        Raises:
          ValueError: ``temporal_delete`` keeps more frames than ``frame_steps``.
        """
        if self.temporal_delete > frame_steps:
            raise ValueError(f"temporal_delete={self.temporal_delete} keeps more frames than the T={frame_steps} "
                             f"built: set data.options.temporal_delete (temporal_delete=) to at most "
                             f"data.time_steps (time_steps=) = {frame_steps}")
        return self.temporal_delete or frame_steps

    def _nda_ops(self) -> list[str]:
        return [name for name in ("roll", "rotate", "cutout") if getattr(self, name) > 0]

    def __call__(self, frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One example's frames ``[T, H, W, C]`` (or ``[T, F]`` for the temporal delete alone) augmented with draws
        from ``rng``."""
        if self.crop_scale < 1.0:
            box = random_resized_crop_box(frames.shape[-3], frames.shape[-2], rng, scale=(self.crop_scale, 1.0))
            frames = resized_crop_frames(frames, *box)
        if self.flip and rng.random() < 0.5:
            frames = frames[..., ::-1, :]
        if self.translate > 0:
            dy, dx = rng.integers(-self.translate, self.translate + 1, size=2)
            frames = shift_frames(frames, int(dy), int(dx))
        ops = self._nda_ops()
        if self.nda:
            ops = [ops[int(rng.integers(len(ops)))]]
        for op in ops:
            frames = self._apply(op, frames, rng)
        if self.temporal_delete:
            frames = frames[temporal_delete_indices(frames.shape[0], self.temporal_delete, rng)]
        return np.ascontiguousarray(frames)

    def _apply(self, op: str, frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if op == "roll":
            dy, dx = rng.integers(-self.roll, self.roll + 1, size=2)
            return np.roll(frames, (int(dy), int(dx)), axis=(-3, -2))
        if op == "rotate":
            return rotate_frames(frames, rng.uniform(-self.rotate, self.rotate))
        y, x = rng.integers(frames.shape[-3]), rng.integers(frames.shape[-2])
        return cutout_frames(frames, int(y), int(x), self.cutout)


def check_keyless_read(augment: EventAugment | None, name: str) -> None:
    """Refuses a read without the loader's keys of a source that deletes frames (its examples have no fixed frames)."""
    if augment is not None and augment.temporal_delete:
        raise ValueError(f"{name}: this training split keeps a random {augment.temporal_delete} of its frames per "
                         "example (temporal_delete); read it through snnjax.data.Loader, which passes each example's "
                         "key (source.read(indices, keys)), or build it without temporal_delete")


class AugmentedFrames(Source):
    """A source whose example ``i`` is ``frames(i)``, augmented from its key by ``augment`` (None: as is), the
    batch's examples read on ``workers`` (``snnjax.data.workers``).

    Subclasses set ``name`` (for errors), ``labels`` (int ``[len]``), ``augment`` and ``workers``, and define
    ``frames``.
    """

    name: str
    labels: np.ndarray
    augment: EventAugment | None

    @abc.abstractmethod
    def frames(self, index: int) -> np.ndarray:
        """Example ``index``'s frames, before augmentation."""

    def _example(self, index: int, key: np.ndarray | None) -> np.ndarray:
        frames = self.frames(index)
        if key is not None and self.augment is not None:
            frames = self.augment(frames, np.random.default_rng(key))
        return frames

    def _read_all(self, indices: np.ndarray, keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        rows = [(int(i), None if keys is None else keys[j]) for j, i in enumerate(indices)]
        return np.stack(self.workers.map(lambda r: self._example(*r), rows)), self.labels[indices]

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_keyless_read(self.augment, self.name)
        return self._read_all(indices, None)

    def _read_keyed(self, indices: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read_all(indices, keys)
