"""``load_run(workdir)``: a trained model rebuilt from a run's ``config.json`` and restored from its checkpoint.

A run's workdir (``train.py --workdir RUN``) holds ``config.json`` (the whole config) and
``checkpoints/<step>/`` (orbax; the parameter tree and BatchNorm statistics, whatever layout
trained it). The model is rebuilt from the config exactly as the trainer built it
(``snnjax.train.loop.init_model``, sizes from the dataset) and returned in eval mode with the
checkpoint's parameters (``snnjax.load_model``, as a notebook restores a model), on the default device.
"""
from __future__ import annotations

import dataclasses
import pathlib

import jax
import ml_collections
from flax import nnx

from snnjax.data import get_source
from snnjax.train import config as config_lib
from snnjax.train.loop import init_model, step_config
from snnjax.train.model_trainer import checkpoint_step, load_model
from snnjax.train.step import StepConfig


@dataclasses.dataclass
class RestoredRun:
    """A run's model with its checkpoint's parameters.

    Attributes:
      config: the run's config (``config.json``).
      model: the model in eval mode (BatchNorm uses its running statistics, dropout is off).
      step: the checkpoint's step.
      step_config: how the trainer turns a batch's inputs into the model's ``[T, N, ...]`` (encoder, dtype).
      workdir: the run's directory.
    """

    config: ml_collections.ConfigDict
    model: nnx.Module
    step: int
    step_config: StepConfig
    workdir: pathlib.Path

    @property
    def time_major(self) -> bool:
        """Whether the data gives event frames ``[T, N, ...]`` (else static images an encoder repeats over T)."""
        return self.step_config.encoder is None

    def source(self, split: str = "test", data_dir: str | None = None):
        """The run's dataset (``split``), from ``data_dir`` instead of the config's when given."""
        return make_source(self.config, split, data_dir)


def make_source(c: ml_collections.ConfigDict, split: str, data_dir: str | None = None):
    """The config's dataset for ``split``, optionally read from ``data_dir``."""
    kwargs, _ = config_lib.source_kwargs(c)
    if data_dir is not None:
        kwargs["data_dir"] = str(data_dir)
    return get_source(c.data.name, split, **kwargs)


def build_model(c: ml_collections.ConfigDict) -> tuple[nnx.Module, StepConfig]:
    """The config's model as the trainer initialises it (sizes from the data), in eval mode, and the step
    settings that turn a batch's inputs into its ``[T, N, ...]`` (encoder, compute dtype)."""
    source = make_source(c, "test")
    model = init_model(c, source)
    model.eval()
    return model, step_config(c, getattr(source, "time_steps", None) is not None)


def load_run(workdir: str | pathlib.Path, step: int | None = None) -> RestoredRun:
    """Rebuild the model of the run in ``workdir`` and restore checkpoint ``step`` (default: the latest).

    Raises:
      FileNotFoundError: no ``config.json`` in ``workdir`` (``snnjax.train.config.load`` reads it).
      CheckpointError: no checkpoint there, or ``step`` is not one of them.
      ValueError: a float64 run while ``jax_enable_x64`` is off.
    """
    workdir = pathlib.Path(workdir)
    c = config_lib.load(workdir)
    config_lib.validate(c)
    if c.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(f"the run in {workdir} trained in float64: call "
                         "jax.config.update('jax_enable_x64', True) before loading it")
    directory, step = checkpoint_step(workdir / "checkpoints", step)
    model, step_cfg = build_model(c)
    return RestoredRun(c, load_model(model, directory, step), step, step_cfg, workdir)
