"""Metric sinks: ``metrics.jsonl`` (one JSON object per logged step, always) and the trackers of ``log_to``.

Trackers (``config.log_to``, comma-separated; each gets the same numeric scalars as ``metrics.jsonl``,
the firing-rate monitor's included):

- ``tensorboard``: event files in ``WORKDIR/tensorboard`` (the default);
- ``wandb``: a Weights & Biases run (``pip install 'snnjax[wandb]'``) in ``WORKDIR/wandb``, named after the
  workdir, holding the config; the project is ``$WANDB_PROJECT`` (default ``snnjax``), and ``$WANDB_MODE``
  (``offline``, ``disabled``) applies as in any wandb program (``wandb sync`` uploads an offline run);
- ``mlflow``: an MLflow run (``pip install 'snnjax[mlflow]'``) at ``$MLFLOW_TRACKING_URI`` (default: the
  SQLite store ``WORKDIR/mlflow.db`` with artifacts in ``WORKDIR/mlartifacts``, which
  ``mlflow ui --backend-store-uri sqlite:///WORKDIR/mlflow.db`` shows; MLflow keeps its folder store only for
  old runs), experiment ``$MLFLOW_EXPERIMENT_NAME`` (default
  ``snnjax``), named after the workdir, the config logged as ``config.json``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import time
from typing import Any

import jax
import numpy as np

TRACKERS = ("tensorboard", "wandb", "mlflow")
_PACKAGES = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow"}


def to_python(values: dict[str, Any]) -> dict[str, Any]:
    """Device/numpy scalars -> plain Python numbers for JSON."""
    out = {}
    for k, v in values.items():
        v = jax.device_get(v)
        out[k] = v.item() if isinstance(v, (np.ndarray, np.generic)) and np.size(v) == 1 else v
    return out


def parse_log_to(value, *, name: str = "config.log_to") -> tuple[str, ...]:
    """The trackers named by ``value`` (``"tensorboard,wandb"``, a sequence, or ``""`` for none); refuses an
    unknown name or one whose package is not installed, saying what to install."""
    names = tuple(v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip())
    for tracker in names:
        if tracker not in TRACKERS:
            raise ValueError(f"{name}={value!r}: unknown tracker {tracker!r}; choose from {', '.join(TRACKERS)} "
                             f"(comma-separated, '' for metrics.jsonl alone)")
        if importlib.util.find_spec(_PACKAGES[tracker]) is None:
            raise ValueError(f"{name}={value!r}: {tracker} is not installed; pip install 'snnjax[{tracker}]' "
                             f"(or remove it from {name})")
    return names


class MetricWriter:
    """Appends to ``WORKDIR/metrics.jsonl`` and each tracker of ``log_to``; a no-op on processes other than 0.

    ``config``: the run's configuration (a JSON-able dict) for the trackers that keep it.
    """

    def __init__(self, workdir: str | pathlib.Path, *, enabled: bool = True, log_to=("tensorboard",),
                 config: dict[str, Any] | None = None):
        self.enabled = enabled
        if not enabled:
            return
        workdir = pathlib.Path(workdir)
        self._jsonl = open(workdir / "metrics.jsonl", "a", buffering=1)
        makers = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}
        self._trackers = [makers[name](workdir, config or {}) for name in parse_log_to(log_to)]

    def write(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        values = to_python(values)
        self._jsonl.write(json.dumps({"step": int(step), **values}) + "\n")
        scalars = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tracker in self._trackers:
            tracker.log(int(step), scalars)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            for tracker in self._trackers:
                tracker.close()


class _TensorBoard:
    def __init__(self, workdir: pathlib.Path, config: dict):
        from tensorboardX import SummaryWriter  # noqa: PLC0415 (loads protobuf: only the writing process needs it)

        self._writer = SummaryWriter(str(workdir / "tensorboard"))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self._writer.add_scalar(k, v, step)

    def close(self) -> None:
        self._writer.close()


class _WandB:
    def __init__(self, workdir: pathlib.Path, config: dict):
        import wandb  # noqa: PLC0415 (an optional extra)

        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "snnjax"), name=workdir.resolve().name,
                               dir=str(workdir), config=config, reinit="create_new")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class _MLflow:
    _KEY = re.compile(r"[^\w\-. /]")  # the characters MLflow allows in a metric name

    def __init__(self, workdir: pathlib.Path, config: dict):
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 (an optional extra)

        local = not os.environ.get("MLFLOW_TRACKING_URI")  # the run's own store: its artifacts beside it
        uri = f"sqlite:///{workdir.resolve() / 'mlflow.db'}" if local else os.environ["MLFLOW_TRACKING_URI"]
        self._client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "snnjax")
        found = self._client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self._client.create_experiment(
            name, artifact_location=(workdir.resolve() / "mlartifacts").as_uri() if local else None)
        self._run_id = self._client.create_run(experiment, run_name=workdir.resolve().name).info.run_id
        self._client.log_dict(self._run_id, config, "config.json")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415 (an optional extra)

        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[Metric(self._KEY.sub("_", k), v, now, step)
                                                      for k, v in scalars.items()])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)
