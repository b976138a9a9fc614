"""Load and run a model exported by ``python -m snnjax.export`` without the model's code (only jax and numpy).

    model = load_exported("model.bin")
    logits = model(x)                       # x [T, N, ...] -> [T, N, K], any N
    states = model.init_states(n)           # streaming: one time step at a time
    logits_t, states = model.step(x[t], states)

The file is a zip archive:

- ``meta.json``: format version, input shape per example and time step, ``time_steps``, dtype,
  the neuron states of the single step (shape without the batch, initial value), the run it came from;
- ``multi_step.jax``: ``jax.export`` serialisation (StableHLO) of ``(params, x [T, b, ...]) -> logits [T, b, K]``;
- ``single_step.jax``: of ``(params, states, x [b, ...]) -> (logits [b, K], states)`` (absent, with the reason
  in ``meta.json``'s ``single_step_note``, for a model that cannot run one time step at a time);
- ``params.npz``: the parameters and BatchNorm statistics, the functions' first argument (a list, in order).

The batch size ``b`` is symbolic: one file serves every batch size.
"""
from __future__ import annotations

import dataclasses
import io
import json
import pathlib
import zipfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FORMAT = "snnjax-export-1"


@dataclasses.dataclass
class ExportedModel:
    """An exported model: ``__call__`` runs the multi-step forward, ``step`` one time step (see the module docstring).

    Attributes:
      meta: ``meta.json``. params: the parameter arrays passed to the functions.
    """

    meta: dict[str, Any]
    params: list[jax.Array]
    multi_step: jax.export.Exported
    single_step: jax.export.Exported | None

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, ...]`` -> logits ``[T, N, K]``."""
        return self.multi_step.call(self.params, jnp.asarray(x, self.meta["dtype"]))

    def init_states(self, batch_size: int) -> list[jax.Array]:
        """Fresh neuron states for ``batch_size`` streams."""
        self._need_step()
        return [jnp.full((batch_size, *s["shape"]), s["init"], s["dtype"]) for s in self.meta["states"]]

    def step(self, x: jax.Array, states: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        """One time step ``x [N, ...]`` from ``states``: ``(logits [N, K], new states)``."""
        self._need_step()
        logits, states = self.single_step.call(self.params, states, jnp.asarray(x, self.meta["dtype"]))
        return logits, list(states)

    def _need_step(self) -> None:
        if self.single_step is None:
            raise ValueError(f"this file has no single-step variant: {self.meta.get('single_step_note')}")


def load_exported(path: str | pathlib.Path) -> ExportedModel:
    """Read a file written by ``snnjax.export``.

    Raises:
      ValueError: not such a file, or a format version this loader does not read.
    """
    try:
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read("meta.json"))
            multi = z.read("multi_step.jax")
            single = z.read("single_step.jax") if "single_step.jax" in z.namelist() else None
            arrays = np.load(io.BytesIO(z.read("params.npz")))
            params = [jnp.asarray(arrays[f"p{i}"]) for i in range(len(arrays.files))]
    except (zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"{path} is not a model written by python -m snnjax.export ({e})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} has format {meta.get('format')!r}; this loader reads {FORMAT!r}")
    if meta["dtype"] == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(f"{path} was exported in float64: call jax.config.update('jax_enable_x64', True) first")
    return ExportedModel(meta, params, jax.export.deserialize(bytearray(multi)),
                         None if single is None else jax.export.deserialize(bytearray(single)))
