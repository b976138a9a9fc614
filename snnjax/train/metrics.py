"""Metric sinks: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard event files."""
from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import numpy as np


def to_python(values: dict[str, Any]) -> dict[str, Any]:
    """Device/numpy scalars -> plain Python numbers for JSON."""
    out = {}
    for k, v in values.items():
        v = jax.device_get(v)
        out[k] = v.item() if isinstance(v, (np.ndarray, np.generic)) and np.size(v) == 1 else v
    return out


class MetricWriter:
    """Appends to ``WORKDIR/metrics.jsonl`` and ``WORKDIR/tensorboard``; a no-op on processes other than 0."""

    def __init__(self, workdir: str | pathlib.Path, *, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        from tensorboardX import SummaryWriter  # noqa: PLC0415 (loads protobuf: only the writing process needs it)

        workdir = pathlib.Path(workdir)
        self._jsonl = open(workdir / "metrics.jsonl", "a", buffering=1)
        self._tb = SummaryWriter(str(workdir / "tensorboard"))

    def write(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        values = to_python(values)
        self._jsonl.write(json.dumps({"step": int(step), **values}) + "\n")
        for k, v in values.items():
            if isinstance(v, (int, float)):
                self._tb.add_scalar(k, v, int(step))

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()
