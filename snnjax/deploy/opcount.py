"""Synaptic operations per layer from measured spikes: AC (spike-driven accumulates) and MAC counts.

For every ``conv`` / ``linear`` op of a model's op chain (``snnjax.deploy.graph``), on a batch ``x [T, N, ...]``:

- input **spikes** (the op follows a neuron, or its input is measured to be all 0/1, e.g. Poisson-encoded
  images): one AC per spike and target, ``AC = sum over spikes of fan-out``; a linear layer's fan-out is
  its ``out_features``, a conv's the output positions whose window holds the input cell (inside the
  padding) times the output channels;
- input **pooled spikes** (spikes through average pooling, VGG's pooling blocks): the pooling is folded into
  the weights (the conv of the pooled map is a strided conv of the spikes with the kernel spread over the
  pooling window and divided by its size), so again ``AC = sum over spikes of fan-out``, each spike taking
  the fan-out of the pooled cell it falls in;
- any other, real-valued input (direct-encoded images, event counts): dense ``MAC = output elements x
  (kernel_h x kernel_w x in_channels)`` (``in_features`` for a linear layer), padding taps included.

Counts are per example (summed over the ``T`` steps, averaged over the batch). Not counted: bias
additions, BatchNorm (folded into the conv / linear before it), pooling (folded into the next layer),
neuron state updates. ``energy_pj`` applies per-op energies: 45 nm CMOS, 32-bit float, from Horowitz,
"Computing's energy problem" (ISSCC 2014): add 0.9 pJ (AC), multiply 3.7 pJ + add 0.9 pJ = 4.6 pJ (MAC).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.deploy.graph import layer_ops
from snnjax.deploy.ops import Op, run_ops

E_AC_PJ = 0.9  # 45 nm, 32-bit float add (Horowitz, ISSCC 2014)
E_MAC_PJ = 4.6  # 45 nm, 32-bit float multiply (3.7 pJ) + add (0.9 pJ)


@dataclasses.dataclass(frozen=True)
class LayerOps:
    """One conv / linear layer's operations per example.

    Attributes:
      name: the op's name (e.g. ``"features.3.conv"``). kind: ``conv`` or ``linear``.
      input: ``spikes``, ``pooled spikes`` or ``real`` (see the module docstring).
      ac: spike-driven accumulates. mac: multiply-accumulates. dense_ops: the dense count of the layer
      (``MAC`` had its input been real-valued), for reference.
      spikes: input spikes per example (before pooling; 0 for real input). input_size: input elements per
      example over all steps (before pooling), so ``spikes / input_size`` is the firing rate.
    """

    name: str
    kind: str
    input: str
    ac: float
    mac: float
    dense_ops: float
    spikes: float
    input_size: int


@dataclasses.dataclass(frozen=True)
class OpReport:
    """Per-layer counts of a batch and the energy estimate."""

    layers: list[LayerOps]
    examples: int

    @property
    def ac(self) -> float:
        return sum(layer.ac for layer in self.layers)

    @property
    def mac(self) -> float:
        return sum(layer.mac for layer in self.layers)

    def energy_pj(self, e_ac: float = E_AC_PJ, e_mac: float = E_MAC_PJ) -> float:
        """Energy per example in pJ: ``AC * e_ac + MAC * e_mac``."""
        return self.ac * e_ac + self.mac * e_mac

    def table(self, e_ac: float = E_AC_PJ, e_mac: float = E_MAC_PJ) -> str:
        """A plain-text table, one row per layer, and the totals."""
        rows = [f"{'layer':<22} {'input':<14} {'rate':>7} {'AC':>14} {'MAC':>14} {'energy uJ':>10}"]
        for r in self.layers:
            rate = f"{r.spikes / r.input_size:.4f}" if r.input != "real" else "-"
            rows.append(f"{r.name:<22} {r.input:<14} {rate:>7} {r.ac:>14,.0f} {r.mac:>14,.0f} "
                        f"{(r.ac * e_ac + r.mac * e_mac) * 1e-6:>10.4f}")
        rows.append(f"{'total':<22} {'':<14} {'':>7} {self.ac:>14,.0f} {self.mac:>14,.0f} "
                    f"{self.energy_pj(e_ac, e_mac) * 1e-6:>10.4f}")
        return "\n".join(rows) + f"\n(per example, mean of {self.examples}; AC {e_ac} pJ, MAC {e_mac} pJ)"


def _conv_geometry(conv) -> tuple[tuple[int, int], tuple[tuple[int, int], ...], tuple[int, int]]:
    stride = conv.strides if isinstance(conv.strides, tuple) else (conv.strides, conv.strides)
    return tuple(conv.kernel_size), tuple(tuple(p) for p in conv.padding), tuple(stride)


def _windows(op: Op, counts: jax.Array) -> jax.Array:
    """Per example, ``sum over input cells of counts x the cell's fan-out over positions`` (int32; a linear layer
    has one position), ``counts [T, N, ...]`` the spikes per input cell; times the output channels (on the host,
    in int64) this is the layer's AC."""
    if op.kind == "linear":
        return jnp.sum(counts.astype(jnp.int32), axis=(0, *range(2, counts.ndim)))
    kernel, padding, stride = _conv_geometry(op.module)
    t, n = counts.shape[:2]
    c = counts.reshape(t * n, *counts.shape[2:]).astype(jnp.float32)
    ones = jnp.ones((*kernel, c.shape[-1], 1), jnp.float32)
    # Each output position sums the counts in its window: summed over positions, every cell counts once per
    # window that holds it, i.e. its fan-out over positions.
    occupancy = jax.lax.conv_general_dilated(c, ones, stride, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sum(jnp.round(occupancy).astype(jnp.int32).reshape(t, n, -1), axis=(0, 2))


def _dense(op: Op, x_shape: Sequence[int], y_shape: Sequence[int]) -> int:
    """Dense MACs per example of ``op`` mapping ``x [T, N, ...]`` to ``y [T, N, ...]``."""
    t, outputs = x_shape[0], int(np.prod(y_shape[2:]))
    if op.kind == "linear":
        return t * outputs * op.module.in_features
    kernel, _, _ = _conv_geometry(op.module)
    return t * outputs * kernel[0] * kernel[1] * op.module.in_features


def _measure(model: nnx.Module, x: jax.Array) -> tuple[dict, dict]:
    """Traced: per conv / linear op, ``(arrays, facts)``: the per-example fan-out sums and spike counts and
    whether the input was binary; and the static facts (input kind, input size per step, shapes)."""
    ops = layer_ops(model)
    found = {}
    source = {"kind": "real", "counts": None}  # what the next conv / linear reads

    def record(op, inputs, outputs):
        if op.kind == "neuron":
            source.update(kind="spikes", counts=outputs, size=outputs[0, 0].size)
        elif op.kind in ("avgpool", "maxpool") and source["kind"] in ("spikes", "pooled spikes"):
            if op.kind == "maxpool":  # a max-pooled spike map is spikes again
                source.update(kind="spikes", counts=outputs, size=outputs[0, 0].size)
            else:  # spike counts per pooled cell (sum pooling of the spikes)
                k = op.size
                window = (1, 1, k, k, 1)
                counts = jax.lax.reduce_window(source["counts"], 0.0, jax.lax.add, window, window, "VALID")
                source.update(kind="pooled spikes", counts=counts)
        elif op.kind in ("flatten", "dropout"):
            if source["counts"] is not None and op.kind == "flatten":
                source["counts"] = source["counts"].reshape(*source["counts"].shape[:2], -1)
        elif op.kind in ("conv", "linear"):
            binary = jnp.all((inputs == 0) | (inputs == 1))
            spike_input = source["kind"] != "real"
            counts = source["counts"] if spike_input else jnp.where(binary, inputs, 0)
            spikes = jnp.sum(counts, axis=(0, *range(2, counts.ndim)))
            size = source["size"] if spike_input else inputs[0, 0].size
            found[op.name] = {"fanout": _windows(op, counts), "spikes": spikes, "binary": binary,
                              "source": source["kind"], "size": size, "x": inputs.shape, "y": outputs.shape}
            source.update(kind="real", counts=None)
        else:  # batchnorm
            source.update(kind="real", counts=None)

    run_ops(ops, x, record=record)
    arrays = {k: {kk: v for kk, v in d.items() if kk in ("fanout", "spikes", "binary")} for k, d in found.items()}
    facts = {k: (d["source"], int(d["size"]), tuple(d["x"]), tuple(d["y"])) for k, d in found.items()}
    return arrays, facts


def count_ops(model: nnx.Module, x: jax.Array) -> OpReport:
    """Per-layer AC / MAC counts of ``model`` (eval mode) on the batch ``x [T, N, ...]`` (see the module docstring)."""
    model.eval()
    values, static = _measure_split(model, x)
    ops = {op.name: op for op in layer_ops(model)}
    n = x.shape[1]
    layers = []
    for name in (name for name in ops if name in static):  # forward order
        v = values[name]
        kind, size, x_shape, y_shape = static[name]
        dense = _dense(ops[name], x_shape, y_shape)
        spike_input = kind != "real" or bool(v["binary"])
        fanout = float(np.sum(np.asarray(v["fanout"], np.int64)) * ops[name].module.out_features) / n
        spikes = float(np.sum(np.asarray(v["spikes"], np.float64))) / n
        label = kind if kind != "real" else ("spikes" if spike_input else "real")
        layers.append(LayerOps(name, ops[name].kind, label, fanout if spike_input else 0.0,
                               0.0 if spike_input else float(dense), float(dense), spikes if spike_input else 0.0,
                               int(size) * x_shape[0]))
    return OpReport(layers, n)


def _measure_split(model, x):
    """``_measure`` jitted: its arrays (on the host) and its static facts."""
    facts = {}

    def traced(model, x):
        arrays, found = _measure(model, x)
        facts.update(found)
        return arrays

    return jax.device_get(jax.jit(traced)(model, x)), facts
