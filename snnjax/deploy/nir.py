"""NIR (Neuromorphic Intermediate Representation, the ``nir`` package) export and import.

    graph = to_nir(model, (48, 48, 2))      # a model whose layers form a chain (snnjax.deploy.calls), eval mode
    nir.write("model.nir", graph)
    model2 = from_nir(nir.read("model.nir"))  # a snnjax.Sequential with the same outputs

What maps to what (NIR uses PyTorch's channels-first layout: tensors ``(C, H, W)``, conv weights
``[O, I, kh, kw]``, linear weights ``[out, in]``; snnjax's channels-last tensors and kernels are
transposed, and a linear layer after an HWC flatten has its inputs reordered to CHW; ``from_nir`` flattens
in NIR's CHW order, ``layers.Flatten("chw")``):

- a 2-D convolution -> ``nir.Conv2d``, ``nnx.Linear`` -> ``nir.Affine`` (``nir.Linear`` without bias);
- ``layers.BatchNorm`` (eval mode) -> folded into the conv / linear before it (``fold_batchnorm``);
- ``layers.AvgPool2d`` -> ``nir.AvgPool2d``; ``layers.Flatten`` -> ``nir.Flatten``; dropout (identity) -> nothing;
- ``IF`` -> ``nir.IF`` with ``r = 1 / dt``; ``LIF`` (and ``PLIF``, its learned tau taken as it is) ->
  ``nir.LIF`` with ``tau = tau_steps * dt``, ``r = 1`` (``decay_input``) or ``tau_steps``, ``v_leak = v_reset``;
- ``CUBALIFNode`` -> ``nir.CubaLIF`` with ``tau_syn = dt / (1 - c_decay)``, ``tau_mem = dt / (1 - v_decay)``,
  ``w_in = tau_syn / dt``, ``r = tau_mem / dt``, ``v_leak = 0`` (decays in [0, 1));
- the readouts: ``NonSpikingLIFNode`` -> ``nir.LI`` with ``tau = tau_steps * dt``, ``r = 1``, ``v_leak = 0``;
  ``NonSpikingIFNode`` -> ``nir.I`` with ``r = 1 / dt`` (``decode=None`` only: NIR has no reduction over time).
  That is SpikingJelly's discretisation (``spikingjelly.activation_based.nir_exchange``; default
  ``dt = 1e-4`` as there, and snnTorch's for ``CubaLIF``): the Euler step of NIR's ODE over ``dt`` is exactly the
  snnjax update (for ``CubaLIF``: the current first, then the potential from the new current).

Import also folds a ``nir.Scale`` right after an affine or convolution layer into it (one factor per output
channel). Not carried by NIR, and refused with an error naming the layer: soft reset (``v_reset=None``; NIR
resets to a potential), max pooling (no node in NIR 1.0), models whose layer calls are not a chain
(``snnjax.deploy.calls.layer_chain``: attention, residual blocks). NIR describes inference, so the
surrogate gradient and ``detach_reset`` (which change only gradients) have no NIR field: they are written to each
spiking neuron node's ``metadata`` (``snnjax_surrogate``, ``snnjax_surrogate_params``: its keywords as JSON,
``snnjax_detach_reset``), which ``from_nir`` reads back and other tools ignore. Import refuses nodes outside this
table (``Threshold``: a step without state or reset, which no snnjax layer computes; ``CubaLI``, ``Delay``,
``SumPool2d``, ...), per-neuron (non-uniform) neuron parameters, parameters that do not fit the layer's shape,
parameters outside the discretisation above (e.g. a ``CubaLIF`` with ``v_leak != 0``), strided or padded pooling
and graphs that are not a chain.

Reading an untrusted file: ``from_nir(path)`` first opens it with h5py and adds up the element counts its
datasets declare (``max_elements``, default :data:`MAX_ELEMENTS`), so a small file claiming huge arrays is refused
before ``nir.read`` reads any; reads it once in a child process (``read_timeout`` seconds at most), since libhdf5
can spin for minutes on a damaged heap, or crash, in native code; then, before building anything, walks the
chain checking every shape against the input and the layer before (positive sizes, matching channels and
features) and every weight and neuron parameter for NaN or infinity. Every fault raises :class:`NIRError`
naming the file. NIR files hold arrays and
strings only (HDF5, no pickle).
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import nir
import numpy as np
from flax import nnx

from snnjax import layers
from snnjax.deploy.calls import dotted, layer_chain
from snnjax.models.sequential import Sequential
from snnjax.neurons import surrogate as sg
from snnjax.neurons.base import decay_rate
from snnjax.neurons.catalogue import CUBALIFNode, NonSpikingIFNode, NonSpikingLIFNode
from snnjax.neurons.modules import BaseNode
from snnjax.runtime.trial_read import READ_TIMEOUT, trial_read

DT = 1e-4  # seconds per time step, SpikingJelly's (and most NIR tools') default
MAX_ELEMENTS = 1 << 27  # default bound on the elements a NIR file's arrays and an imported model's layers may hold
# Run in a child process first: libhdf5 can spin for minutes on a damaged heap, or crash, in native code.
_TRIAL_READ = "nir:read"  # what the child process calls on the file (trial_read's target)


class NIRError(ValueError):
    """The model or graph has something NIR (or this mapping) cannot carry; the message names it."""


def fold_batchnorm(kernel: np.ndarray, bias: np.ndarray | None, bn: nnx.Module) -> tuple[np.ndarray, np.ndarray]:
    """``(kernel, bias)`` of an affine layer (output channels last) followed by eval-mode BatchNorm ``bn`` as one.

    ``bn(z) = (z - mean) * s + beta`` with ``s = scale / sqrt(var + eps)``, so ``W' = W * s`` (per output
    channel) and ``b' = (b - mean) * s + beta``.
    """
    s = np.asarray(bn.scale[...]) / np.sqrt(np.asarray(bn.var[...]) + bn.eps)
    b = np.zeros(kernel.shape[-1], kernel.dtype) if bias is None else np.asarray(bias)
    return np.asarray(kernel) * s, (b - np.asarray(bn.mean[...])) * s + np.asarray(bn.bias[...])


def _nir_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[2], shape[0], shape[1]) if len(shape) == 3 else shape


def _chain_of(model: nnx.Module, input_shape: tuple[int, ...]) -> list[tuple[str, nnx.Module, tuple, tuple]]:
    """``(name, module of model, input shape, output shape)`` per layer call of ``model``'s chain (one example
    at one time step, shapes without ``[T, N]``)."""
    found = []

    def trace(m, x):
        y, calls = layer_chain(m, x)
        found.extend((c.name, tuple(c.x.shape[2:]), tuple(c.y.shape[2:])) for c in calls)
        return y

    jax.eval_shape(trace, model, jax.ShapeDtypeStruct((1, 1, *input_shape), jnp.float32))
    modules = {dotted(path): m for path, m in nnx.iter_modules(model)}
    return [(name, modules[name], x, y) for name, x, y in found]


def to_nir(model: nnx.Module, input_shape: tuple[int, ...], *, dt: float = DT) -> nir.NIRGraph:
    """``model``'s eval-mode forward as a NIR graph (a chain ``input -> ... -> output``).

    ``input_shape``: one example at one time step, channels-last ``(H, W, C)`` or ``(F,)``.

    Raises:
      NIRError: something NIR cannot carry (see the module docstring); UnsupportedModelError for non-chains.
    """
    shape = tuple(int(d) for d in input_shape)
    nodes: list[tuple[str, Any]] = [("input", nir.Input(input_type=np.array(_nir_shape(shape))))]
    flat_from = None  # (H, W, C) of the last HWC flatten, until the linear layer that reads it
    for call_name, module, x_shape, y_shape in _chain_of(model, shape):
        name = call_name.replace(".", "_")
        if isinstance(module, nnx.Dropout):
            continue
        if isinstance(module, layers.BatchNorm):
            last_name, last = nodes[-1]
            if not isinstance(last, (nir.Conv2d, nir.Affine, nir.Linear)):
                raise NIRError(f"{call_name}: BatchNorm after {type(last).__name__} cannot be folded; NIR has no "
                               "BatchNorm node (only one right after a conv or linear layer is supported)")
            channels_last = np.moveaxis(last.weight, 0, -1)  # [..., out]
            bias = getattr(last, "bias", None)
            kernel, bias = fold_batchnorm(channels_last, bias, module)
            weight = np.moveaxis(kernel, -1, 0)
            nodes[-1] = (last_name, nir.Conv2d(input_shape=last.input_shape, weight=weight, stride=last.stride,
                                               padding=last.padding, dilation=last.dilation, groups=last.groups,
                                               bias=bias) if isinstance(last, nir.Conv2d) else
                         nir.Affine(weight=weight, bias=bias))
        elif isinstance(module, nnx.Conv):
            if len(x_shape) != 3 or isinstance(module.padding, str) or len(module.kernel_size) != 2:
                raise NIRError(f"{call_name}: NIR export takes 2-D convolutions with integer padding on [H, W, C] "
                               f"inputs (layers.conv2d), got kernel {module.kernel_size} on {x_shape}")
            (pl, ph), (pl2, ph2) = module.padding
            if pl != ph or pl2 != ph2:
                raise NIRError(f"{call_name}: asymmetric padding {module.padding} has no NIR form")
            stride = module.strides if isinstance(module.strides, tuple) else (module.strides, module.strides)
            kernel = _kernel(module)
            bias = (np.asarray(module.bias[...]) if module.bias is not None
                    else np.zeros(kernel.shape[-1], kernel.dtype))
            nodes.append((name, nir.Conv2d(input_shape=x_shape[:2], weight=kernel.transpose(3, 2, 0, 1),
                                           stride=stride, padding=(pl, pl2), dilation=(1, 1), groups=1, bias=bias)))
        elif isinstance(module, nnx.Linear):
            kernel = _kernel(module)  # [in, out]
            if flat_from is not None:  # inputs in snnjax's HWC order -> NIR's CHW order
                h, w, c = flat_from
                kernel = kernel.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(h * w * c, -1)
                flat_from = None
            weight = kernel.T
            nodes.append((name, nir.Affine(weight=weight, bias=np.asarray(module.bias[...]))
                          if module.bias is not None else nir.Linear(weight=weight)))
        elif isinstance(module, layers.AvgPool2d):
            k, stride = module.kernel_size, module.stride or module.kernel_size
            nodes.append((name, nir.AvgPool2d(kernel_size=np.array([k, k]), stride=np.array([stride, stride]),
                                              padding=np.array([0, 0]))))
        elif isinstance(module, layers.MaxPool2d):
            raise NIRError(f"{call_name}: NIR 1.0 has no max pooling node; build the net with average pooling "
                           "(snnjax.layers.AvgPool2d; a spec {'kind': 'avgpool'})")
        elif isinstance(module, layers.Flatten):
            if len(x_shape) == 1:
                continue
            nodes.append((name, nir.Flatten(input_type={"input": np.array(_nir_shape(x_shape))}, start_dim=0,
                                            end_dim=-1)))
            flat_from = x_shape if module.order == "hwc" and len(x_shape) == 3 else None
        elif isinstance(module, BaseNode):
            nodes.append((name, _neuron_node(call_name, module, _nir_shape(x_shape), dt)))
        else:
            raise NIRError(f"{call_name} is a {type(module).__name__}, which has no NIR node here (to_nir takes "
                           "convolutions, linear layers, BatchNorm, average pooling, flatten, dropout, IF / LIF / "
                           "PLIF / CUBALIFNode neurons and NonSpikingIFNode / NonSpikingLIFNode readouts)")
        shape = y_shape
    nodes.append(("output", nir.Output(output_type=np.array(_nir_shape(shape)))))
    edges = [(a, b) for (a, _), (b, _) in zip(nodes[:-1], nodes[1:], strict=True)]
    return nir.NIRGraph(nodes=dict(nodes), edges=edges)


def _kernel(module: nnx.Module) -> np.ndarray:
    """The kernel a conv / linear layer computes with (a weight-standardised layer's standardised one)."""
    if isinstance(module, (layers.WSConv2d, layers.WSLinear)):
        return np.asarray(module.standardized_kernel())
    return np.asarray(module.kernel[...])


def _neuron_node(name: str, node: BaseNode, shape: tuple[int, ...], dt: float):
    full = lambda v: np.full(shape, float(v))  # noqa: E731
    if isinstance(node, (NonSpikingIFNode, NonSpikingLIFNode)):
        if node.decode is not None:
            raise NIRError(f"{name}: decode={node.decode!r} reduces the potentials over time, which no NIR node does; "
                           "export the readout with decode=None and reduce its [T, ...] output yourself")
        if isinstance(node, NonSpikingIFNode):
            return nir.I(r=full(1.0 / dt))
        return nir.LI(tau=full(node.tau * dt), r=full(1.0), v_leak=full(0.0))
    cfg = node.config
    if cfg is None and not isinstance(node, CUBALIFNode):
        raise NIRError(f"{name} is a {type(node).__name__}, which has no NIR node here (to_nir takes IF / LIF / PLIF / "
                       "CUBALIFNode neurons and NonSpikingIFNode / NonSpikingLIFNode readouts)")
    if node.v_reset is None:
        raise NIRError(f"{name}: soft reset (v_reset=None) has no NIR form (NIR neurons reset to v_reset); "
                       "train with a hard reset (e.g. v_reset=0.0) to export")
    meta = {"snnjax_surrogate": sg.name_of(node.surrogate_function),
            "snnjax_surrogate_params": json.dumps(sg.params_of(node.surrogate_function)),
            "snnjax_detach_reset": int(node.detach_reset)}
    if isinstance(node, CUBALIFNode):
        for key in ("c_decay", "v_decay"):
            if not 0.0 <= getattr(node, key) < 1.0:
                raise NIRError(f"{name}: {key}={getattr(node, key)} is outside [0, 1), where NIR's CubaLIF time "
                               "constant dt / (1 - decay) is positive and finite")
        tau_syn, tau_mem = dt / (1.0 - node.c_decay), dt / (1.0 - node.v_decay)
        return nir.CubaLIF(tau_syn=full(tau_syn), tau_mem=full(tau_mem), r=full(tau_mem / dt), v_leak=full(0.0),
                           v_threshold=full(node.v_threshold), v_reset=full(node.v_reset), w_in=full(tau_syn / dt),
                           metadata=meta)
    if cfg.kind == "IF":
        return nir.IF(r=full(1.0 / dt), v_threshold=full(cfg.v_threshold), v_reset=full(cfg.v_reset), metadata=meta)
    tau = cfg.tau if cfg.kind == "LIF" else 1.0 / float(decay_rate(cfg, node.decay_param()))
    return nir.LIF(tau=full(tau * dt), r=full(1.0 if cfg.decay_input else tau), v_leak=full(cfg.v_reset),
                   v_threshold=full(cfg.v_threshold), v_reset=full(cfg.v_reset), metadata=meta)


def _chain(graph: nir.NIRGraph) -> list[tuple[str, Any]]:
    """The nodes of ``graph`` from its single Input to its single Output, refusing anything but a chain."""
    inputs = [k for k, v in graph.nodes.items() if isinstance(v, nir.Input)]
    if len(inputs) != 1:
        raise NIRError(f"the graph has {len(inputs)} input nodes; from_nir takes a chain with one input")
    succ: dict[str, list[str]] = {}
    for a, b in graph.edges:
        succ.setdefault(a, []).append(b)
    missing = sorted({n for edge in graph.edges for n in edge} - graph.nodes.keys())
    if missing:
        raise NIRError(f"edges name node(s) {missing[:5]} that the graph does not hold")
    order, name = [], inputs[0]
    while True:
        order.append((name, graph.nodes[name]))
        nxt = succ.get(name, [])
        if not nxt:
            break
        if len(nxt) > 1 or len(order) > len(graph.nodes):
            raise NIRError(f"node {name!r} feeds {nxt}: from_nir takes a chain (no branches, residuals or recurrence)")
        name = nxt[0]
    if not isinstance(order[-1][1], nir.Output) or len(order) != len(graph.nodes):
        raise NIRError("the graph is not one chain from its input to its output")
    return order


def _uniform(value, what: str) -> float:
    values = np.unique(np.asarray(value))
    if values.dtype.kind not in "biuf" or not np.isfinite(values).all():
        raise NIRError(f"{what} holds NaN, infinite or non-numeric values")
    if values.size != 1:
        raise NIRError(f"{what} differs between neurons ({values.size} values); snnjax neurons share one value")
    return float(values[0])


def _pair(value, what: str) -> int:
    v = np.asarray(value).reshape(-1)
    if v.size not in (1, 2) or v.dtype.kind not in "iuf" or not (np.isfinite(v) & (v == np.round(v))).all():
        raise NIRError(f"{what} {v.tolist()[:4]} is not one or two integers")
    v = np.broadcast_to(v, (2,))
    if v[0] != v[1]:
        raise NIRError(f"{what} {tuple(v)} differs between height and width; snnjax takes one value")
    return int(v[0])


def _training_settings(node) -> dict[str, Any]:
    meta = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (node.metadata or {}).items()}
    out = {}
    if "snnjax_surrogate" in meta:
        params = json.loads(meta.get("snnjax_surrogate_params", "{}"))
        if isinstance(params.get("grad_window"), list):
            params["grad_window"] = tuple(params["grad_window"])
        out["surrogate_function"] = sg.get(str(meta["snnjax_surrogate"]), **params)
    if "snnjax_detach_reset" in meta:
        out["detach_reset"] = bool(int(meta["snnjax_detach_reset"]))
    return out


def from_nir(graph: nir.NIRGraph | str | pathlib.Path, *, dt: float = DT, rngs: nnx.Rngs | None = None,
             dtype=None, param_dtype=None, max_elements: int = MAX_ELEMENTS,
             read_timeout: float = READ_TIMEOUT) -> Sequential:
    """A ``Sequential`` (``Sequential.from_specs``) computing NIR ``graph`` (or the file it is in), in eval mode.

    ``dt``: seconds per time step the graph's time constants are read with (as written by ``to_nir``).
    ``max_elements``: the most array elements the file may declare and any one activation or weight may hold.
    ``read_timeout``: seconds the trial read of a file (in a child process) may take.

    Raises:
      NIRError: a node, parameter, shape or topology outside the mapping (see the module docstring), or a file
        that is not an intact NIR graph; the message names the file.
    """
    if isinstance(graph, nir.NIRGraph):
        return _from_graph(graph, dt, rngs, dtype, param_dtype, max_elements)
    try:
        _check_file_size(pathlib.Path(graph), max_elements)
        trial_read(_TRIAL_READ, [str(graph)], read_timeout, "read_timeout", NIRError)  # its Python errors: below
        try:
            loaded = nir.read(graph)
        except Exception as e:  # noqa: BLE001 (nir.read raises many types for files it cannot parse)
            raise NIRError(f"not a readable NIR graph ({type(e).__name__}: {e})") from None
        return _from_graph(loaded, dt, rngs, dtype, param_dtype, max_elements)
    except NIRError as e:
        raise NIRError(f"{graph}: {e}") from None


def _check_file_size(path: pathlib.Path, max_elements: int) -> None:
    """Refuse a file that is not HDF5 with a ``node`` group, or whose datasets declare over ``max_elements``."""
    import h5py  # noqa: PLC0415 (nir's own dependency)

    try:
        with h5py.File(path, "r") as f:
            if "node" not in f:
                raise NIRError("no 'node' group: not a NIR file")
            total = 0

            def count(_, obj):
                nonlocal total
                if isinstance(obj, h5py.Dataset):
                    total += int(np.prod(obj.shape, dtype=object)) if obj.shape else 1

            f["node"].visititems(count)
    except NIRError:
        raise
    except Exception as e:  # noqa: BLE001 (h5py raises OSError, RuntimeError, KeyError, ... for damaged files)
        raise NIRError(f"not a readable HDF5 file ({type(e).__name__}: {e}): truncated, damaged or of another "
                       "format") from None
    if total > max_elements:
        raise NIRError(f"its arrays declare {total} elements, over max_elements={max_elements} (pass a larger "
                       "max_elements to from_nir if the model really is that large)")


def _finite(name: str, what: str, value) -> np.ndarray:
    value = np.asarray(value)
    if value.dtype.kind not in "biuf" or value.dtype.kind == "f" and not np.isfinite(value).all():
        raise NIRError(f"{name}: {what} holds NaN, infinite or non-numeric values")
    return value


def _from_graph(graph: nir.NIRGraph, dt: float, rngs, dtype, param_dtype, max_elements: int) -> Sequential:
    chain = _chain(graph)
    raw = np.asarray(chain[0][1].input_type["input"])
    if raw.ndim != 1 or not raw.size or raw.dtype.kind not in "iuf" or not (raw > 0).all() \
            or raw.dtype.kind == "f" and not (raw == np.round(raw)).all():
        raise NIRError(f"input shape {raw.tolist()} is not a list of positive integers ((F,) or (C, H, W))")
    in_shape = tuple(int(d) for d in raw)
    current = in_shape  # NIR layout, one example at one time step

    def bound(name: str, elements: int) -> None:
        if elements > max_elements:
            raise NIRError(f"{name}: {elements} elements, over max_elements={max_elements}")

    bound("input", int(np.prod(in_shape, dtype=object)))
    shape = (in_shape[1], in_shape[2], in_shape[0]) if len(in_shape) == 3 else in_shape
    specs, weights = [], []
    for name, node in chain[1:-1]:
        if isinstance(node, nir.Conv2d):
            if _pair(node.dilation, f"{name}: dilation") != 1 or int(np.asarray(node.groups)) != 1:
                raise NIRError(f"{name}: dilated or grouped convolutions are not supported")
            if isinstance(node.padding, str):
                raise NIRError(f"{name}: padding {node.padding!r}; give integer padding")
            w = _finite(name, "weight", node.weight)
            if w.ndim != 4 or len(current) != 3 or w.shape[1] != current[0] or min(w.shape) < 1:
                raise NIRError(f"{name}: conv weight {w.shape} does not fit its input {current} (weights are "
                               "[out, in, kh, kw] on (C, H, W))")
            if w.shape[2] != w.shape[3]:
                raise NIRError(f"{name}: kernel {w.shape[2:]} is not square")
            k, stride, pad = w.shape[2], _pair(node.stride, f"{name}: stride"), _pair(node.padding, f"{name}: padding")
            out = [(d + 2 * pad - k) // stride + 1 if stride > 0 and pad >= 0 else 0 for d in current[1:]]
            if min(out) < 1:
                raise NIRError(f"{name}: kernel {k}, stride {stride}, padding {pad} on {current} leaves no output")
            bias = _finite(name, "bias", node.bias)
            if bias.shape != (w.shape[0],):
                raise NIRError(f"{name}: bias {bias.shape} does not match {w.shape[0]} output channels")
            specs.append({"kind": "conv", "features": w.shape[0], "kernel": k, "stride": stride, "padding": pad})
            weights.append((w.transpose(2, 3, 1, 0), bias))
            current = (w.shape[0], *out)
        elif isinstance(node, (nir.Affine, nir.Linear)):
            w = _finite(name, "weight", node.weight)  # [out, in]
            if w.ndim != 2 or len(current) != 1 or w.shape[1] != current[0] or w.shape[0] < 1:
                raise NIRError(f"{name}: weight {w.shape} does not fit its input {current} (weights are [out, in] "
                               "on a flat (F,) input)")
            bias = _finite(name, "bias", node.bias) if isinstance(node, nir.Affine) else np.zeros(w.shape[0], w.dtype)
            if bias.shape != (w.shape[0],):
                raise NIRError(f"{name}: bias {bias.shape} does not match {w.shape[0]} outputs")
            specs.append({"kind": "linear", "features": w.shape[0]})
            weights.append((w.T, bias))
            current = (w.shape[0],)
        elif isinstance(node, nir.AvgPool2d):
            k, s = _pair(node.kernel_size, f"{name}: kernel_size"), _pair(node.stride, f"{name}: stride")
            if k != s or _pair(node.padding, f"{name}: padding") != 0:
                raise NIRError(f"{name}: average pooling with stride {s} != kernel {k} or padding is not supported")
            if len(current) != 3 or k < 1 or min(current[1:]) < k:
                raise NIRError(f"{name}: pooling {k}x{k} does not fit its input {current}")
            specs.append({"kind": "avgpool", "size": k})
            weights.append(None)
            current = (current[0], current[1] // k, current[2] // k)
        elif isinstance(node, nir.Flatten):
            shape_in = node.input_type["input"]
            if node.start_dim != 0 or node.end_dim not in (-1, len(shape_in) - 1 if shape_in is not None else -1):
                raise NIRError(f"{name}: only a flatten of every dim of an example (start_dim=0, end_dim=-1)")
            specs.append({"kind": "flatten", "order": "chw"})
            weights.append(None)
            current = (int(np.prod(current)),)
        elif isinstance(node, nir.Scale):
            _fold_scale(name, node, specs, weights, current)
        elif isinstance(node, NEURON_NODES):
            for field in NEURON_FIELDS:
                if getattr(node, field, None) is not None:
                    _fitting(name, field, getattr(node, field), current)
            specs.append(_neuron_spec(name, node, dt))
            weights.append(None)
        else:
            raise NIRError(f"node {name!r} is a {type(node).__name__}, which from_nir does not map (it takes "
                           "Affine, Linear, Conv2d, AvgPool2d, Flatten, Scale after an affine or conv layer, IF, LIF, "
                           "CubaLIF, LI, I)")
        bound(name, int(np.prod(current, dtype=object)))
        if weights[-1] is not None:
            bound(f"{name}'s weight", weights[-1][0].size)
    model = Sequential.from_specs(shape, specs, rngs=rngs or nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype)
    for layer, w in zip(model.layers, weights, strict=True):
        if w is not None:
            layer.kernel[...] = jnp.asarray(w[0], layer.kernel[...].dtype)
            layer.bias[...] = jnp.asarray(w[1], layer.bias[...].dtype)
    model.eval()
    return model


NEURON_NODES = (nir.IF, nir.LIF, nir.CubaLIF, nir.LI, nir.I)
NEURON_FIELDS = ("r", "tau", "tau_syn", "tau_mem", "v_leak", "v_threshold", "v_reset", "w_in")


def _fitting(name: str, what: str, value, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` broadcast to the layer's ``shape`` (NIR layout), refusing NaN, infinity and shapes that do not fit."""
    value = _finite(name, what, value)
    try:
        fits = np.broadcast_shapes(value.shape, shape) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise NIRError(f"{name}: {what} of shape {value.shape} does not fit its input {tuple(shape)}")
    return np.broadcast_to(value, shape)


def _fold_scale(name: str, node, specs: list, weights: list, shape: tuple[int, ...]) -> None:
    """Fold ``nir.Scale`` node ``name`` (``y = x * scale``) into the affine or conv layer before it."""
    if not specs or specs[-1]["kind"] not in ("linear", "conv"):
        raise NIRError(f"{name}: a Scale folds only into the affine or convolution layer right before it (snnjax "
                       "has no scaling layer)")
    scale = _fitting(name, "scale", node.scale, shape)
    if specs[-1]["kind"] == "conv":
        per_channel = scale.reshape(shape[0], -1)
        if not (per_channel == per_channel[:, :1]).all():
            raise NIRError(f"{name}: the scale varies within a channel; only one factor per output channel folds "
                           "into the convolution before it")
        scale = per_channel[:, 0]
    kernel, bias = weights[-1]
    weights[-1] = (kernel * scale, bias * scale)


def _neuron_spec(name: str, node, dt: float) -> dict[str, Any]:
    if isinstance(node, nir.I):
        if not np.isclose(_uniform(node.r, f"{name}: r") * dt, 1.0, rtol=1e-6):
            raise NIRError(f"{name}: I with r={_uniform(node.r, f'{name}: r')} at dt={dt}; NonSpikingIFNode adds its "
                           "input (r = 1/dt): pass the dt the graph was written with")
        return {"kind": "neuron", "type": "NonSpikingIFNode"}
    if isinstance(node, nir.LI):
        tau = _uniform(node.tau, f"{name}: tau") / dt
        if not tau > 1.0:
            raise NIRError(f"{name}: LI tau/dt = {tau} must be > 1 (pass the dt the graph was written with)")
        if not np.isclose(_uniform(node.r, f"{name}: r"), 1.0, rtol=1e-6):
            raise NIRError(f"{name}: LI r must be 1 (NonSpikingLIFNode: V + (X - V) / tau)")
        _zero_leak(name, node)
        return {"kind": "neuron", "type": "NonSpikingLIFNode", "tau": tau}
    v_threshold = _uniform(node.v_threshold, f"{name}: v_threshold")
    v_reset = _uniform(node.v_reset, f"{name}: v_reset")
    extra = _training_settings(node)
    if isinstance(node, nir.CubaLIF):
        seconds = {key: _uniform(getattr(node, key), f"{name}: {key}") for key in ("tau_syn", "tau_mem")}
        taus = {key: tau / dt for key, tau in seconds.items()}
        for key, steps in taus.items():
            if not steps >= 1.0:
                raise NIRError(f"{name}: CubaLIF {key}/dt = {steps} must be >= 1 (a decay in [0, 1); pass the dt the "
                               "graph was written with)")
        for key, want, tau in (("w_in", "tau_syn/dt", taus["tau_syn"]), ("r", "tau_mem/dt", taus["tau_mem"])):
            got = _uniform(getattr(node, key), f"{name}: {key}")
            if not np.isclose(got, tau, rtol=1e-6):
                raise NIRError(f"{name}: CubaLIF {key}={got} must be {want}={tau} (CUBALIFNode adds its input to the "
                               "current, and the current to the potential, unscaled)")
        _zero_leak(name, node)
        return {"kind": "neuron", "type": "CUBALIFNode", "c_decay": 1.0 - dt / seconds["tau_syn"],
                "v_decay": 1.0 - dt / seconds["tau_mem"], "v_threshold": v_threshold, "v_reset": v_reset, **extra}
    r = _uniform(node.r, f"{name}: r")
    if isinstance(node, nir.IF):
        if not np.isclose(r * dt, 1.0, rtol=1e-6):
            raise NIRError(f"{name}: IF with r={r} at dt={dt}; snnjax's IF adds its input (r = 1/dt): pass the dt "
                           "the graph was written with")
        return {"kind": "neuron", "type": "IF", "v_threshold": v_threshold, "v_reset": v_reset, **extra}
    tau = _uniform(node.tau, f"{name}: tau") / dt
    if not tau > 1.0:
        raise NIRError(f"{name}: LIF tau/dt = {tau} must be > 1 (pass the dt the graph was written with)")
    if np.isclose(r, 1.0, rtol=1e-6):
        decay_input = True
    elif np.isclose(r, tau, rtol=1e-6):
        decay_input = False
    else:
        raise NIRError(f"{name}: LIF r={r} must be 1 (decay_input=True) or tau/dt={tau} (decay_input=False)")
    if not np.isclose(_uniform(node.v_leak, f"{name}: v_leak"), v_reset, rtol=1e-6, atol=1e-12):
        raise NIRError(f"{name}: LIF v_leak must equal v_reset (snnjax leaks towards the reset potential)")
    return {"kind": "neuron", "type": "LIF", "tau": tau, "decay_input": decay_input, "v_threshold": v_threshold,
            "v_reset": v_reset, **extra}


def _zero_leak(name: str, node) -> None:
    if _uniform(node.v_leak, f"{name}: v_leak") != 0.0:
        target = "CUBALIFNode" if isinstance(node, nir.CubaLIF) else "NonSpikingLIFNode"
        raise NIRError(f"{name}: {type(node).__name__} v_leak must be 0 ({target}, which it maps to, leaks towards 0)")
