"""ImageNet-style image folders: ``train/<class>/*.JPEG`` and ``val/<class>/*``.

Layout::

    data_dir/train/<class>/*.JPEG     any class folder names; classes are numbered in sorted order
    data_dir/val/<class>/*            the same class names (split "test" or "val")

Any ``.jpeg``, ``.jpg``, ``.png``, ``.bmp`` or ``.webp`` file (case-insensitive) is an image;
files are taken in sorted order per class. Images are decoded with Pillow on ``num_workers``
threads (decoding and resizing release the GIL) into ``[size, size, 3]`` float32 in ``[0, 1]``:

* ``"train"`` (with the loader's keys): torchvision's ``RandomResizedCrop(size)`` (scale
  ``(0.08, 1)``, ratio ``(3/4, 4/3)``, ten tries then a centre crop) with bilinear resampling,
  then a horizontal flip with probability 1/2 (``flip=False`` turns it off); the draws come from
  ``np.random.default_rng((seed, epoch, position))``, so the order and the augmentation are
  functions of the step and a resumed run reads the same batches;
* evaluation (no keys, or the val split): the shorter side resized to ``round(size / 0.875)``
  (256 for 224) and the centre ``size x size`` crop, done as one bilinear resampling of that
  crop's window in the original image (torchvision resizes, then crops).

The loader's bounded prefetch queue (``data.prefetch`` batches) runs ahead of the step, and each
process reads only its slice of every batch.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from snnjax.data.augment import random_resized_crop_box
from snnjax.data.source import Source
from snnjax.data.workers import Workers

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".webp")
EVAL_CROP_FRACTION = 0.875
MAX_PIXELS = 89_478_485  # Pillow's default decompression-bomb bound (its warning), here an error
MAX_PIXELS_PER_BYTE = 1024  # a real JPEG or RGB PNG holds under ~350 pixels per byte of file
_SPLIT_DIRS = {"train": "train", "test": "val", "val": "val"}
_HINT = ("Arrange the images as data_dir/train/<class>/*.JPEG and data_dir/val/<class>/*.JPEG (for ImageNet: "
         "extract ILSVRC2012_img_train.tar per class and sort the validation images into class folders).")


def center_crop_box(height: int, width: int, size: int) -> tuple[float, float, float, float]:
    """``(left, top, right, bottom)`` in the original image of the eval crop: shorter side to
    ``round(size / 0.875)``, then the centre ``size x size``."""
    resized = round(size / EVAL_CROP_FRACTION)
    scale = resized / min(height, width)
    side = size / scale  # the crop's side in original pixels
    top, left = (height - side) / 2, (width - side) / 2
    return left, top, left + side, top + side


def load_image(path: Path, size: int, rng: np.random.Generator | None, flip: bool) -> np.ndarray:
    """One image as ``[size, size, 3]`` float32 in [0, 1]; ``rng`` None: the eval crop, else the train augmentation.

    Raises:
      ValueError: naming ``path`` if Pillow cannot decode it, its header claims more than :data:`MAX_PIXELS` or
        over :data:`MAX_PIXELS_PER_BYTE` pixels per byte of the file (a decompression bomb), or a JPEG lacks
        its end marker (truncated: decoders fill the rest with grey).
    """
    try:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            pixels = width * height
            if pixels > MAX_PIXELS or pixels > MAX_PIXELS_PER_BYTE * max(len(data), 1024):
                raise ValueError(f"its header claims {width}x{height} pixels from {len(data)} bytes (at most "
                                 f"{MAX_PIXELS} pixels, {MAX_PIXELS_PER_BYTE} per byte): a decompression bomb or a "
                                 "damaged header")
            if image.format == "JPEG" and data.rfind(b"\xff\xd9") < 0:
                raise ValueError("the JPEG has no end-of-image marker: the file is truncated")
            image = image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as err:
        raise ValueError(f"{path}: cannot decode the image ({err}); replace or remove the file") from err
    if rng is None:
        out = image.resize((size, size), Image.Resampling.BILINEAR, box=center_crop_box(height, width, size))
    else:
        top, left, h, w = random_resized_crop_box(height, width, rng)
        out = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if flip and rng.random() < 0.5:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out, np.float32) / 255.0


class ImageFolderSource(Source):
    """Images of a class-folder tree as ``[n, size, size, 3]`` float32 in [0, 1].

    Args:
      files, labels: the images and their class indices, in dataset order.
      num_classes: number of classes.
      size: output side in pixels.
      augment: apply the train augmentation when the loader passes keys.
      flip: include the random horizontal flip in the augmentation.
      num_workers: decoding threads.
    """

    def __init__(self, files: list[Path], labels: list[int], num_classes: int, *, size: int = 224,
                 augment: bool = False, flip: bool = True, num_workers: int = 4):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size} (data.options.size / size=)")
        self.files = files
        self.labels = np.asarray(labels, np.int32)
        self.num_classes = int(num_classes)
        self.size = int(size)
        self.example_shape = (self.size, self.size, 3)
        self.augment = augment
        self.flip = flip
        self.workers = Workers(num_workers, "images")

    def __len__(self) -> int:
        return len(self.files)

    def _load_all(self, indices: np.ndarray, keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        def one(j: int) -> np.ndarray:
            rng = np.random.default_rng(keys[j]) if keys is not None and self.augment else None
            return load_image(self.files[int(indices[j])], self.size, rng, self.flip)

        return np.stack(self.workers.map(one, range(len(indices)))), self.labels[indices]

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._load_all(indices, None)

    def _read_keyed(self, indices: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._load_all(indices, keys)


def list_images(folder: Path) -> list[Path]:
    """The image files directly in ``folder``, sorted by name."""
    return sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())


def image_folder_source(split: str, *, data_dir: str | os.PathLike | None, size: int | None = None,
                        flip: bool | None = None, num_workers: int | None = None) -> ImageFolderSource:
    """An image-folder split: ``"train"`` (augmented) or ``"test"`` / ``"val"`` (centre crop).

    Args:
      data_dir: the folder holding ``train/`` and ``val/``.
      size: output side (default 224).
      flip: random horizontal flip in training (default True).
      num_workers: decoding threads (default ``min(4, cpus)``).
    """
    if split not in _SPLIT_DIRS:
        raise ValueError(f"image_folder split must be one of {tuple(_SPLIT_DIRS)}, got {split!r}")
    if data_dir is None:
        raise ValueError(f"image_folder needs data_dir. {_HINT}")
    root = Path(data_dir)
    train_dir, split_dir = root / "train", root / _SPLIT_DIRS[split]
    for folder in (train_dir, split_dir):
        if not folder.is_dir():
            raise FileNotFoundError(f"image_folder: directory {folder} not found. {_HINT}")
    classes = sorted(d.name for d in train_dir.iterdir() if d.is_dir())
    if not classes:
        raise FileNotFoundError(f"image_folder: no class folders in {train_dir}. {_HINT}")
    unknown = sorted({d.name for d in split_dir.iterdir() if d.is_dir()} - set(classes))
    if unknown:
        raise ValueError(f"image_folder: {split_dir} has class folders {unknown[:5]} that {train_dir} lacks; both "
                         "splits must use the training classes' names")
    files, labels = [], []
    for label, name in enumerate(classes):
        folder = split_dir / name
        found = list_images(folder) if folder.is_dir() else []
        files += found
        labels += [label] * len(found)
    if not files:
        raise FileNotFoundError(f"image_folder: no images under {split_dir}. {_HINT}")
    workers = num_workers if num_workers is not None else min(4, os.cpu_count() or 1)
    return ImageFolderSource(files, labels, len(classes), size=224 if size is None else size,
                             augment=split == "train", flip=True if flip is None else flip, num_workers=workers)
