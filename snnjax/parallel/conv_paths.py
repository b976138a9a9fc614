"""Which path runs each convolution and linear layer of a model under a plan's mesh, and why: what ``print(plan)``
says of them.

On the CPU backend ``snnjax.layers.conv_cpu`` (``linear_cpu``) picks, per convolution (linear layer) while it is
traced, the sparse-input kernels (``snnjax.layers.sparse_conv``: taken per call where few inputs are nonzero) or
XLA's convolution (dot), and records the choice here within ``recording()``; ``neuron_paths.trace`` records these
beside the neurons' paths.
"""
from __future__ import annotations

import contextlib
import contextvars

from snnjax.recording import Recorder

_RECORD = Recorder("snnjax_conv_paths")
_PLANNED_DEVICES: contextvars.ContextVar[int] = contextvars.ContextVar("snnjax_conv_planned_devices", default=1)


@contextlib.contextmanager
def planned_devices(count: int):
    """Within this context the convolutions traced are taken to span ``count`` devices: a plan's trace runs under
    a mesh without the ``stage`` axis (as the neurons see it), while its step's convolutions see the whole mesh."""
    token = _PLANNED_DEVICES.set(int(count))
    try:
        yield
    finally:
        _PLANNED_DEVICES.reset(token)


def planned() -> int:
    """The device count ``planned_devices`` sets (1 outside it)."""
    return _PLANNED_DEVICES.get()


def recording():
    """Collect ``(input shape, kernel shape, path, why)`` of every CPU convolution (4-D kernel) and linear layer
    (``[in, out]``) traced within this context."""
    return _RECORD.recording()


def record(x_shape: tuple[int, ...], w_shape: tuple[int, ...], path: str, why: str) -> None:
    """Note one convolution's or linear layer's path (``"sparse"``: the sparse kernels where few inputs are nonzero,
    else XLA's; ``"xla"``) and why, where a ``recording()`` is active."""
    _RECORD.add((tuple(x_shape), tuple(w_shape), path, why))


def summary(found: list) -> list[dict]:
    """One row per kind (``"convolutions"``, ``"linear layers"``), path and reason, in call order: ``{"kind",
    "path", "why", "layers"}``."""
    rows: dict[tuple, dict] = {}
    for _, w_shape, path, why in found:
        kind = "convolutions" if len(w_shape) == 4 else "linear layers"
        rows.setdefault((kind, path, why), {"kind": kind, "path": path, "why": why, "layers": 0})["layers"] += 1
    return list(rows.values())


def describe(rows: list[dict]) -> list[str]:
    """``print(plan)``'s lines for ``summary``'s rows."""
    return [f"  {r['kind']} ({r['layers']} layer{'s' if r['layers'] > 1 else ''}): {r['path']}: {r['why']}"
            for r in rows]
