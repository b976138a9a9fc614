"""Synaptic operations per layer from measured spikes: AC (spike-driven accumulates) and MAC counts.

For every convolution / linear layer of a model's chain of layer calls (``snnjax.deploy.calls.layer_chain``), on a
batch ``x [T, N, ...]``:

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
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax import layers
from snnjax.deploy.calls import UnsupportedModelError, layer_chain
from snnjax.neurons.modules import BaseNode

E_AC_PJ = 0.9  # 45 nm, 32-bit float add (Horowitz, ISSCC 2014)
E_MAC_PJ = 4.6  # 45 nm, 32-bit float multiply (3.7 pJ) + add (0.9 pJ)


@dataclasses.dataclass(frozen=True)
class LayerOps:
    """One conv / linear layer's operations per example.

    Attributes:
      name: the layer's path (e.g. ``"features.3.conv"``). kind: ``conv`` or ``linear``.
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


def _conv_geometry(name: str, conv) -> tuple[tuple[int, int], tuple[tuple[int, int], ...], tuple[int, int]]:
    stride = conv.strides if isinstance(conv.strides, tuple) else (conv.strides, conv.strides)
    if len(conv.kernel_size) != 2 or isinstance(conv.padding, str):
        raise UnsupportedModelError(f"{name}: op counts take 2-D convolutions with explicit padding (layers.conv2d); "
                                    f"got kernel {conv.kernel_size}, padding {conv.padding!r}")
    return tuple(conv.kernel_size), tuple(tuple(p) for p in conv.padding), tuple(stride)


def _windows(name: str, conv, counts: jax.Array) -> jax.Array:
    """Per example, ``sum over input cells of counts x the cell's fan-out over positions`` (int32; a linear layer
    (``conv`` None) has one position), ``counts [T, N, ...]`` the spikes per input cell; times the output channels
    (on the host, in int64) this is the layer's AC."""
    if conv is None:
        return jnp.sum(counts.astype(jnp.int32), axis=(0, *range(2, counts.ndim)))
    kernel, padding, stride = _conv_geometry(name, conv)
    t, n = counts.shape[:2]
    c = counts.reshape(t * n, *counts.shape[2:]).astype(jnp.float32)
    ones = jnp.ones((*kernel, c.shape[-1], 1), jnp.float32)
    # Each output position sums the counts in its window: summed over positions, every cell counts once per
    # window that holds it, i.e. its fan-out over positions.
    occupancy = jax.lax.conv_general_dilated(c, ones, stride, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sum(jnp.round(occupancy).astype(jnp.int32).reshape(t, n, -1), axis=(0, 2))


def _measure(model: nnx.Module, x: jax.Array) -> tuple[dict, dict]:
    """Traced: per conv / linear call of the model's chain (``snnjax.deploy.calls.layer_chain``), ``(arrays,
    facts)``: the per-example fan-out sums and spike counts and whether the input was binary; and the static facts
    (kind, input kind, input size per step, dense MACs, output channels)."""
    _, calls = layer_chain(model, x)
    found = {}
    source = {"kind": "real", "counts": None}  # what the next conv / linear reads
    for call in calls:
        m, inputs, outputs = call.module, call.x, call.y
        spiking = source["kind"] in ("spikes", "pooled spikes")
        if isinstance(m, BaseNode):
            source.update(kind="spikes", counts=outputs, size=outputs[0, 0].size)
        elif isinstance(m, layers.MaxPool2d) and spiking:  # a max-pooled spike map is spikes again
            source.update(kind="spikes", counts=outputs, size=outputs[0, 0].size)
        elif isinstance(m, layers.AvgPool2d) and spiking and m.stride in (None, m.kernel_size):
            window = (1, 1, m.kernel_size, m.kernel_size, 1)  # spike counts per pooled cell (sum pooling)
            counts = jax.lax.reduce_window(source["counts"], 0.0, jax.lax.add, window, window, "VALID")
            source.update(kind="pooled spikes", counts=counts)
        elif isinstance(m, (layers.Flatten, nnx.Dropout, layers.AvgPool2d, layers.MaxPool2d)):
            if isinstance(m, layers.AvgPool2d):  # overlapping windows: real-valued
                source.update(kind="real", counts=None)
        elif isinstance(m, (nnx.Conv, nnx.Linear)):
            conv = m if isinstance(m, nnx.Conv) else None
            binary = jnp.all((inputs == 0) | (inputs == 1))
            spike_input = source["kind"] != "real"
            counts = source["counts"] if spike_input else jnp.where(binary, inputs, 0)
            spikes = jnp.sum(counts, axis=(0, *range(2, counts.ndim)))
            size = source["size"] if spike_input else inputs[0, 0].size
            fan_in = m.in_features * (1 if conv is None else math.prod(_conv_geometry(call.name, conv)[0]))
            dense = inputs.shape[0] * math.prod(outputs.shape[2:]) * fan_in
            found[call.name] = ({"fanout": _windows(call.name, conv, counts), "spikes": spikes, "binary": binary},
                                ("linear" if conv is None else "conv", source["kind"], int(size) * inputs.shape[0],
                                 dense, m.out_features))
            source.update(kind="real", counts=None)
        elif isinstance(m, layers.BatchNorm):
            source.update(kind="real", counts=None)
        else:
            raise UnsupportedModelError(
                f"{call.name} is a {type(m).__name__}, which operation counts have no rule for (they take "
                "convolutions, linear layers, BatchNorm, pooling, flatten, dropout and spiking neurons)")
    return {k: v[0] for k, v in found.items()}, {k: v[1] for k, v in found.items()}


def count_ops(model: nnx.Module, x: jax.Array) -> OpReport:
    """Per-layer AC / MAC counts of ``model`` (eval mode) on the batch ``x [T, N, ...]`` (see the module docstring).

    Raises:
      UnsupportedModelError: the model's layers are not a chain (``snnjax.deploy.calls.layer_chain``).
    """
    model.eval()
    values, static = _measure_split(model, x)
    n = x.shape[1]
    layers_ = []
    for name, (kind, source, size, dense, out_features) in static.items():  # forward order
        v = values[name]
        spike_input = source != "real" or bool(v["binary"])
        fanout = float(np.sum(np.asarray(v["fanout"], np.int64)) * out_features) / n
        spikes = float(np.sum(np.asarray(v["spikes"], np.float64))) / n
        label = source if source != "real" else ("spikes" if spike_input else "real")
        layers_.append(LayerOps(name, kind, label, fanout if spike_input else 0.0, 0.0 if spike_input else float(dense),
                                float(dense), spikes if spike_input else 0.0, size))
    return OpReport(layers_, n)


def _measure_split(model, x):
    """``_measure`` jitted: its arrays (on the host) and its static facts."""
    facts = {}

    def traced(model, x):
        arrays, found = _measure(model, x)
        facts.update(found)
        return arrays

    return jax.device_get(jax.jit(traced)(model, x)), facts
