"""Plots for notebooks: spike rasters, membrane traces, firing rates per layer, where arrays live on devices.

Needs matplotlib (``pip install 'snnjax[viz]'``). Every function draws on ``ax`` (a new figure's axes
when not given) and returns the axes.

    rec = snnjax.monitor.record(model, x)
    viz.raster(rec["layers.2"]["spikes"])                      # one example's spikes, [T, N, ...]
    viz.membrane(rec["layers.2"]["v"], rec["layers.2"]["spikes"], threshold=1.0)
    viz.firing_rates(snnjax.monitor.firing_rates(model, x))
    viz.sharding(state.params["layers"][0]["kernel"])          # any rank: a conv kernel's I x O plane
    viz.stage_rows(trainer.plan)                               # a pipeline's per-device rows by parameter
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np

from snnjax.parallel.describe import shard_blocks
from snnjax.parallel.describe import stage_rows as _stage_rows

try:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
except ImportError as e:  # an optional extra
    raise ImportError("snnjax.viz draws with matplotlib: pip install 'snnjax[viz]' (or pip install matplotlib)") from e

__all__ = ["firing_rates", "membrane", "raster", "sharding", "stage_rows"]


def _axes(ax, figsize=(6, 3)):
    return ax if ax is not None else plt.subplots(figsize=figsize)[1]


def _per_example(x, example: int) -> np.ndarray:
    """``[T, N, ...]`` -> example ``example``'s ``[T, F]`` (``[T, F]`` stays)."""
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"expected [T, N, ...] (or [T, F]), got shape {x.shape}")
    return x.reshape(x.shape[0], -1) if x.ndim == 2 else x[:, example].reshape(x.shape[0], -1)


def raster(spikes, *, example: int = 0, max_neurons: int | None = 200, ax=None, title: str | None = None):
    """Spike raster of one example: time steps on x, neurons (flattened) on y; ``spikes [T, N, ...]`` or ``[T, F]``."""
    s = _per_example(spikes, example)
    if max_neurons is not None:
        s = s[:, :max_neurons]
    t, n = np.nonzero(s)
    ax = _axes(ax)
    ax.scatter(t, n, marker="|", s=30, color="black")
    ax.set(xlim=(-0.5, s.shape[0] - 0.5), ylim=(-0.5, s.shape[1] - 0.5), xlabel="time step", ylabel="neuron",
           title=title or f"spikes ({int(s.sum())} in {s.shape[0]} steps x {s.shape[1]} neurons)")
    return ax


def membrane(v, spikes=None, *, example: int = 0, neurons: Sequence[int] = (0, 1, 2, 3), threshold: float | None = None,
             ax=None, title: str | None = None):
    """Membrane potential of a few neurons over time (``v [T, N, ...]`` or ``[T, F]``; SpikingJelly's ``v_seq``
    holds the potential after reset), spikes marked, the threshold dashed."""
    vs = _per_example(v, example)
    ss = _per_example(spikes, example) if spikes is not None else None
    ax = _axes(ax)
    steps = np.arange(vs.shape[0])
    for i in neurons:
        (line,) = ax.plot(steps, vs[:, i], marker=".", label=f"neuron {i}")
        if ss is not None:
            fired = np.nonzero(ss[:, i])[0]
            ax.scatter(fired, vs[fired, i], marker="^", s=40, color=line.get_color())
    if threshold is not None:
        ax.axhline(threshold, linestyle="--", color="gray", label="threshold")
    ax.set(xlabel="time step", ylabel="v", title=title or "membrane potential (^: spike)")
    ax.legend(fontsize="small")
    return ax


def firing_rates(rates: Mapping[str, float], *, ax=None, title: str = "firing rate per layer"):
    """Bar chart of ``snnjax.monitor.firing_rates``' output (spikes per neuron per step)."""
    ax = _axes(ax, (6, 0.4 * len(rates) + 1))
    names = list(rates)
    ax.barh(range(len(names)), [rates[k] for k in names])
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xlabel="spikes / neuron / step", title=title)
    return ax


def sharding(array: jax.Array, *, dims: tuple[int, int] | None = None, ax=None, title: str | None = None):
    """Which device holds which block of ``array`` (any rank; ``snnjax.parallel.shard_blocks`` chooses the two
    dims shown: the sharded ones, else the trailing ones). Each block is labelled with its devices."""
    dims, blocks = shard_blocks(array, dims)
    shape = tuple(array.shape)
    n_rows = shape[dims[0]] if dims[0] is not None else 1
    n_cols = shape[dims[1]] if dims[1] is not None else 1
    ax = _axes(ax, (5, 4))
    colours = plt.get_cmap("tab20")
    for k, b in enumerate(blocks):
        (r0, r1), (c0, c1) = b["rows"], b["cols"]
        ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=colours(k % 20), edgecolor="black"))
        ax.text((c0 + c1) / 2, (r0 + r1) / 2, ",".join(map(str, b["devices"])), ha="center", va="center",
                fontsize="small")
    ax.set(xlim=(0, n_cols), ylim=(n_rows, 0), xlabel=f"dim {dims[1]} ({n_cols})",
           ylabel=f"dim {dims[0]} ({n_rows})" if dims[0] is not None else "",
           title=title or f"{shape} {getattr(array.sharding, 'spec', '')}")
    return ax


def stage_rows(plan, *, ax=None, title: str | None = None):
    """A pipeline plan's packed parameter rows (one per stage device), each parameter's span named."""
    if plan.packing is None:
        raise ValueError(f"stage_rows: this plan (mode {plan.mode!r}) has no pipeline rows; plan with stage > 1")
    rows = _stage_rows(plan.packing)
    ax = _axes(ax, (10, 0.8 * plan.packing.stages + 1))
    colours = plt.get_cmap("tab20")
    for k, r in enumerate(rows):
        ax.add_patch(Rectangle((r["offset"], r["device"] - 0.4), r["size"], 0.8, facecolor=colours(k % 20),
                               edgecolor="black", linewidth=0.5))
        if r["size"] > plan.packing.width / 25:
            ax.text(r["offset"] + r["size"] / 2, r["device"], r["path"], ha="center", va="center", fontsize="x-small",
                    rotation=90 if r["size"] < plan.packing.width / 8 else 0)
    ax.set(xlim=(0, plan.packing.width), ylim=(plan.packing.stages - 0.5, -0.5), xlabel="offset in the row",
           ylabel="stage device", title=title or f"pipeline parameter rows [{plan.packing.stages}, "
           f"{plan.packing.width}]")
    ax.set_yticks(range(plan.packing.stages))
    return ax
