"""tonic datasets and transforms as sources: the event data snnTorch, Norse, spyx and Sinabs users load.

From a config (``data.name=tonic``; tonic is the optional extra ``snnjax[tonic]``)::

    --config.data.name=tonic --config.data.data_dir=DIR --config.data.time_steps=T
    --config.data.options.tonic_dataset=NMNIST
    --config.data.options.tonic_transforms="Denoise(filter_time=10000)"             # both splits
    --config.data.options.tonic_augment="DropEvent(p=0.1), RandomFlipPolarity(p=0.5)"  # training only

``tonic_dataset`` names a class of ``tonic.datasets`` built with ``save_to=DIR`` (tonic's layout:
``DIR/NMNIST/Train/<digit>/*.bin``, ...) and ``train=`` (or ``split=``) from the split. The files are read
in place and never downloaded: tonic's own check that its archive and every file are present is replaced
by "at least one example", so a partial folder (a few files) reads too. The transforms are tonic's
(``tonic.transforms``), written as calls with literal arguments; a ``sensor_size`` they take and are not
given is the dataset's. Every example then goes through ``ToFrame(sensor_size, n_time_bins=T)``: ``T``
equal time bins (tonic's integration, not SpikingJelly's equal event counts).

From Python, any tonic-style dataset object (``len``, ``dataset[i] -> (events, label)``, ``sensor_size``)
with its own ``transform``::

    source = tonic_source(tonic.datasets.NMNIST(DIR, train=True, transform=...), time_steps=T)
    trainer.fit(snnjax.data.Loader(source, 64).batches())

Frames: tonic's ``[T, P, H, W]`` become ``[T, H, W, P]`` (snnjax's event frames, float32 counts; the loader
makes batches ``[T, N, H, W, P]``), and a one-row sensor's ``[T, 1, W]`` (SHD, SSC) becomes ``[T, W]``.

tonic's random transforms draw from NumPy's global generator; each example is read with that generator
seeded from its key (training: ``(seed, epoch, position)`` from the loader; otherwise its index), under a
lock, so augmentation is a function of the step and a resumed run reads the same batches. The lock covers
the transforms only where snnjax applies them (the config route), so ``num_workers`` threads read and frame
examples in parallel and transform them one at a time; a dataset object's own ``transform`` runs inside
``dataset[i]``, so there the whole read is locked.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from snnjax.data.source import Source
from snnjax.data.workers import Workers

_GLOBAL_RNG = threading.Lock()  # NumPy's global generator, which tonic's random transforms draw from
_INSTALL = "tonic is not installed: pip install 'snnjax[tonic]' (or pip install tonic)"


def _tonic():
    try:
        import tonic  # noqa: PLC0415 (an optional extra)
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    return tonic


class TonicSource(Source):
    """A tonic-style dataset's examples as frames ``[n, T, H, W, P]`` (or ``[n, T, W]``) float32 and labels.

    Args:
      dataset: ``len(dataset)``, ``dataset[i] -> (events, label)``: tonic's structured event arrays (then
        ``sensor_size`` ``(W, H, P)`` is needed and ``ToFrame`` is applied here) or frames ``[T, P, H, W]``.
      time_steps: ``T``, ToFrame's ``n_time_bins``; None where ``dataset`` gives frames already.
      transform: tonic transforms applied to the events of every read, before ``ToFrame``.
      augment: tonic transforms applied to the events of keyed reads (the loader's training reads).
      num_classes: number of classes (default: ``len(dataset.classes)``, else ``max(dataset.targets) + 1``).
      num_workers: threads reading a batch's examples (1: the caller's thread).
      name: the dataset's name in errors.
    """

    def __init__(self, dataset, time_steps: int | None = None, *, transform: Callable | None = None,
                 augment: Callable | None = None, num_classes: int | None = None, num_workers: int = 1,
                 name: str | None = None):
        self.dataset = dataset
        self.name = name or type(dataset).__name__
        self.workers = Workers(num_workers, "tonic")
        self.transform, self.augment = transform, augment
        self._own_transform = any(getattr(dataset, k, None) is not None for k in ("transform", "transforms"))
        self._to_frame = None
        if time_steps is not None:
            if int(time_steps) != time_steps or time_steps < 1:
                raise ValueError(f"time_steps must be an integer >= 1, got {time_steps!r} (data.time_steps)")
            sensor = getattr(dataset, "sensor_size", None)
            if sensor is None:
                raise ValueError(f"{self.name} has no sensor_size, which ToFrame needs; give its examples as frames "
                                 "(the dataset's own transform=ToFrame(...)) and time_steps=None")
            self._to_frame = _tonic().transforms.ToFrame(sensor_size=tuple(sensor), n_time_bins=int(time_steps))
        if len(dataset) == 0:
            raise FileNotFoundError(f"{self.name}: the dataset holds no examples; see its files' layout in tonic's "
                                    "documentation of the class")
        self.num_classes = int(num_classes) if num_classes is not None else _num_classes(dataset, self.name)
        first, _ = self._example(0, None)
        self.example_shape = first.shape
        self.time_steps = first.shape[0]

    def __len__(self) -> int:
        return len(self.dataset)

    def _example(self, index: int, key: np.ndarray | None) -> tuple[np.ndarray, int]:
        seed = np.random.SeedSequence([int(k) for k in key] if key is not None else [index]).generate_state(4)
        augment = self.augment if key is not None else None
        if self._own_transform:
            with _seeded(seed):
                events, label = self.dataset[index]
                events = _apply(events, self.transform, augment)
        else:
            events, label = self.dataset[index]
            if self.transform is not None or augment is not None:
                with _seeded(seed):
                    events = _apply(events, self.transform, augment)
        if self._to_frame is not None:
            events = self._to_frame(events)
        return _snnjax_frames(np.asarray(events), self.name), int(label)

    def _read_all(self, indices: np.ndarray, keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        rows = self.workers.map(lambda j: self._example(int(indices[j]), None if keys is None else keys[j]),
                                range(len(indices)))
        shapes = {frames.shape for frames, _ in rows}
        if shapes != {self.example_shape}:
            raise ValueError(f"{self.name}: examples of shapes {sorted(shapes)}, not all {self.example_shape}; "
                             "frame them to a fixed T (ToFrame(n_time_bins=T), data.time_steps)")
        return np.stack([f for f, _ in rows]), np.asarray([label for _, label in rows], np.int32)

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read_all(indices, None)

    def _read_keyed(self, indices: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read_all(indices, keys)


@contextlib.contextmanager
def _seeded(seed: np.ndarray):
    """NumPy's global generator seeded with ``seed`` for this thread alone, restored after."""
    with _GLOBAL_RNG:
        state = np.random.get_state()
        np.random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state)


def _apply(events, transform: Callable | None, augment: Callable | None):
    for f in (transform, augment):
        if f is not None:
            events = f(events)
    return events


def _snnjax_frames(frames: np.ndarray, name: str) -> np.ndarray:
    """tonic's ``[T, P, H, W]`` -> ``[T, H, W, P]``; ``[T, 1, W]`` -> ``[T, W]``; float32."""
    if frames.dtype.names is not None:
        raise ValueError(f"{name}: examples are events, not frames: pass time_steps (ToFrame's n_time_bins)")
    if frames.ndim == 4:
        return np.ascontiguousarray(np.moveaxis(frames, 1, -1), np.float32)
    if frames.ndim == 3 and frames.shape[1] == 1:
        return frames[:, 0].astype(np.float32)
    raise ValueError(f"{name}: frames of shape {frames.shape}; expected tonic's [T, P, H, W] or [T, 1, W]")


def _num_classes(dataset, name: str) -> int:
    classes = getattr(dataset, "classes", None)
    if hasattr(classes, "__len__") and not isinstance(classes, str) and len(classes):  # a list, or SHD's array
        return len(classes)
    targets = getattr(dataset, "targets", None)
    if targets is not None and len(targets):
        return int(np.max(np.asarray(targets))) + 1
    raise ValueError(f"{name} lists no classes or targets: pass num_classes= (data.options.num_classes)")


def tonic_source(dataset, time_steps: int | None = None, **kwargs: Any) -> TonicSource:
    """A tonic dataset object as a source (``TonicSource(dataset, time_steps, **kwargs)``; see the module)."""
    return TonicSource(dataset, time_steps, **kwargs)


def parse_transforms(spec: str | None, sensor_size: Sequence[int], key: str) -> Callable | None:
    """``"Denoise(filter_time=10000), DropEvent(p=0.1)"`` -> ``tonic.transforms.Compose`` of those (None if empty).

    Only calls of ``tonic.transforms`` classes with literal arguments are read (nothing is evaluated); a
    ``sensor_size`` a transform takes and is not given is ``sensor_size``. ``ValueError`` naming ``key``
    otherwise, or for ``ToFrame`` (snnjax adds it with ``n_time_bins=data.time_steps``).
    """
    if not spec or not spec.strip():
        return None
    transforms = _tonic().transforms
    try:
        calls = ast.parse(f"[{spec}]", mode="eval").body.elts
    except SyntaxError as err:
        raise ValueError(f"{key}={spec!r} is not a list of calls such as 'Denoise(filter_time=10000), "
                         f"DropEvent(p=0.1)': {err.msg}") from err
    out = []
    for call in calls:
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            raise ValueError(f"{key}: {ast.unparse(call)!r} is not a call of a tonic transform, e.g. DropEvent(p=0.1)")
        name = call.func.id
        cls = getattr(transforms, name, None)
        if name == "ToFrame":
            raise ValueError(f"{key}: leave ToFrame out; snnjax adds ToFrame(n_time_bins=data.time_steps)")
        if not isinstance(cls, type):
            raise ValueError(f"{key}: tonic.transforms has no transform {name!r}")
        try:
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except ValueError as err:
            raise ValueError(f"{key}: the arguments of {ast.unparse(call)!r} must be literals") from err
        if "sensor_size" in inspect.signature(cls).parameters and "sensor_size" not in kwargs and not args:
            kwargs["sensor_size"] = tuple(sensor_size)
        out.append(cls(*args, **kwargs))
    return transforms.Compose(out)


def _refuse_download(self) -> None:
    raise FileNotFoundError(f"snnjax does not download: put {type(self).__name__}'s files under "
                            f"{self.location_on_system}")


def tonic_dataset_source(split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 10,
                         tonic_dataset: str | None = None, tonic_transforms: str | None = None,
                         tonic_augment: str | None = None, num_classes: int | None = None,
                         num_workers: int = 1) -> TonicSource:
    """``data.name=tonic``: the class ``tonic_dataset`` of ``tonic.datasets`` read from ``data_dir`` (its
    ``save_to``) as frames of ``time_steps`` time bins; ``tonic_transforms`` on both splits,
    ``tonic_augment`` on training reads (see the module docstring); ``num_workers`` reading threads."""
    tonic = _tonic()
    names = sorted(n for n in dir(tonic.datasets) if isinstance(getattr(tonic.datasets, n), type))
    cls = getattr(tonic.datasets, tonic_dataset or "", None)
    if not isinstance(cls, type):
        raise ValueError(f"tonic_dataset={tonic_dataset!r} (data.options.tonic_dataset) is not a class of "
                         f"tonic.datasets: {', '.join(names)}")
    if data_dir is None:
        raise ValueError(f"tonic {tonic_dataset} needs data_dir (data.data_dir): the save_to folder holding "
                         f"tonic's {tonic_dataset}/ folder")
    params = inspect.signature(cls.__init__).parameters
    if "train" in params:
        if split not in ("train", "test"):
            raise ValueError(f"tonic {tonic_dataset} has splits 'train' and 'test', not {split!r}")
        split_kwargs = {"train": split == "train"}
    elif "split" in params:
        split_kwargs = {"split": split}
    else:
        raise ValueError(f"tonic {tonic_dataset} takes neither train= nor split=; build it in Python and pass it "
                         "to snnjax.data.tonic_source")
    in_place = type(cls.__name__, (cls,), {"_check_exists": lambda self: True, "download": _refuse_download})
    dataset = in_place(str(Path(data_dir)), **split_kwargs)
    if len(dataset) == 0:
        raise FileNotFoundError(f"tonic {tonic_dataset}: no {split} examples under {dataset.location_on_system}; "
                                f"let tonic download them once (tonic.datasets.{tonic_dataset}(save_to="
                                f"{str(data_dir)!r})) or extract its archives there")
    sensor = cls.sensor_size if getattr(cls, "sensor_size", None) is not None else dataset.sensor_size
    transform = parse_transforms(tonic_transforms, sensor, "data.options.tonic_transforms")
    augment = parse_transforms(tonic_augment, sensor, "data.options.tonic_augment")  # checked on every split
    return TonicSource(dataset, time_steps, transform=transform, augment=augment if split == "train" else None,
                       num_classes=num_classes, num_workers=num_workers, name=f"tonic {tonic_dataset}")
