"""Check snnjax against SpikingJelly reference files (format: tests/fixtures/spikingjelly/README.md).

    python -m snnjax.interop check FILE.npz [--impl {auto,xla,pallas,native,scan}]

``FILE.npz`` holds the arrays, its sibling ``FILE.json`` the cases: a list of
neuron cases, or a mapping of model-case name to model description. Everything
is recomputed in float64; spikes must match exactly, real values and gradients
within ``TOLERANCE`` normwise relative error (``snnjax.neurons.compare.rel_error``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from snnjax import neurons
from snnjax.interop import spikingjelly
from snnjax.models import (
    CIFAR10DVSVGG,
    MaxResNet,
    MSResNet,
    ParametricLIFNet,
    QKFormer,
    ResNet,
    SpikeDrivenTransformer,
    Spikformer,
)
from snnjax.models.vgg import DEFAULT_POOLS
from snnjax.neurons import base as B
from snnjax.neurons import surrogate as sg
from snnjax.neurons.compare import rel_error
from snnjax.neurons.kernels import dispatch
from snnjax.neurons.modules import BaseNode
from snnjax.neurons.psn import PSN, MaskedPSN, SlidingPSN

TOLERANCE = 1e-8
# A parameter whose reference gradient is below this fraction of the whole gradient's norm is
# analytically zero (e.g. a conv bias followed by train-mode BatchNorm): both sides are rounding
# noise, so it is compared at this scale instead of relative to itself.
NEGLIGIBLE_GRAD = 1e-6


def parse_surrogate(spec: str | dict[str, Any]) -> sg.Surrogate:
    """A surrogate named in a reference file: a name of ``surrogate.SURROGATES``, optionally followed by its alpha,
    or a mapping of ``name`` and the class's keywords.

    ``sigmoid4`` -> ``Sigmoid(alpha=4)``, ``atan2`` -> ``ATan(alpha=2)``, ``soft_sign`` -> ``SoftSign()``,
    ``{"name": "s2nn", "alpha": 3.0, "beta": 0.7}`` -> ``S2NN(alpha=3.0, beta=0.7)``.
    """
    if isinstance(spec, dict):
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items() if k != "name"}
        return sg.get(spec["name"], **params)
    if spec in sg.SURROGATES:
        return sg.get(spec)
    m = re.fullmatch(r"([a-z_]+?)_?(\d+(?:\.\d+)?)?", spec)
    if m is None:
        raise ValueError(f"cannot parse surrogate {spec!r} in reference file: a name, then optionally alpha")
    return sg.get(m[1], None if m[2] is None else float(m[2]))


def case_arrays(arrays, prefix: str) -> dict[str, np.ndarray]:
    """The arrays of one case: the entries of ``arrays`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix):]: arrays[k] for k in arrays if k.startswith(prefix)}


def neuron_config(case: dict[str, Any]) -> B.NeuronConfig:
    """The ``NeuronConfig`` a reference neuron case describes."""
    return B.NeuronConfig(kind=case["kind"], tau=float(case.get("tau", 2.0)),
                          decay_input=bool(case.get("decay_input", True)),
                          v_threshold=float(case.get("v_threshold", 1.0)), v_reset=case.get("v_reset", 0.0),
                          detach_reset=bool(case.get("detach_reset", False)),
                          surrogate=parse_surrogate(case.get("surrogate", "sigmoid4")))


def plif_w(case: dict[str, Any], arrays: dict[str, np.ndarray]) -> np.ndarray:
    """PLIF's ``w``: from the file, else from ``init_tau`` as SpikingJelly initialises it (``-log(init_tau - 1)``)."""
    if "w" in arrays:
        return arrays["w"]
    return np.asarray(-math.log(float(case.get("init_tau", 2.0)) - 1.0))


@functools.partial(jax.jit, static_argnums=0, static_argnames="impl")
def neuron_outputs(cfg: B.NeuronConfig, x: jax.Array, gy: jax.Array, w: jax.Array | None, impl: str = "auto"):
    """``(spikes, v_seq, dx, dw)`` of ``multistep`` for the loss ``sum(spikes * gy)`` (jitted per config and impl).

    ``x``, ``gy`` and the outputs but ``dw`` are ``[T, ...]``; ``w`` and ``dw`` are PLIF's scalar (None otherwise).
    """
    def loss(x, w):
        s, v_seq = dispatch.multistep(cfg, x, None, w, return_v_seq=True, impl=impl)
        return jnp.sum(s * gy), (s, v_seq)

    (_, (s, v_seq)), (gx, gw) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w)
    return s, v_seq, gx, gw


def check_neuron_case(case: dict[str, Any], arrays: dict[str, np.ndarray], impl: str = "auto") -> dict[str, Any]:
    """Recompute one neuron case with ``multistep(..., impl=impl)``; returns its errors and ``ok``."""
    cfg = neuron_config(case)
    if impl != "auto":  # a case this implementation does not run (it says why) is reported, not failed
        reason = dispatch.IMPLEMENTATIONS[impl].unsupported_reason(cfg, arrays["x"].shape, arrays["x"].dtype,
                                                                   jax.default_backend())
        if reason is not None:
            return {"not_run": f"impl={impl!r}: {reason}", "ok": True}
    w = jnp.asarray(plif_w(case, arrays)) if cfg.kind == "PLIF" else None
    s, v_seq, gx, gw = neuron_outputs(cfg, jnp.asarray(arrays["x"]), jnp.asarray(arrays["grad_spikes"]), w,
                                      impl=impl)
    # Spikes (or spike counts) exactly; a surrogate with spiking=False outputs real values.
    spikes = ({"spike_mismatches": int(np.sum(np.asarray(s) != arrays["spikes"]))} if cfg.surrogate.spiking
              else {"spikes": rel_error(s, arrays["spikes"])})
    out = {
        **spikes,
        "v_seq": rel_error(v_seq, arrays["v_seq"]),
        "grad_x": rel_error(gx, arrays["grad_x"]),
    }
    if cfg.kind == "PLIF":
        out["grad_w"] = rel_error(gw, arrays["grad_w"])
    out["ok"] = out.get("spike_mismatches", 0) == 0 and all(
        v <= TOLERANCE for k, v in out.items() if k != "spike_mismatches")
    return out


@functools.partial(jax.jit, static_argnums=0)
def surrogate_outputs(surrogate: sg.Surrogate, x: jax.Array) -> dict[str, jax.Array]:
    """At the points ``x``: the call's values (``forward``), the gradient of their sum (``grad_x``),
    ``derivative`` (the xla backward's factor) and, where the surrogate has one, ``primitive`` (jitted per
    surrogate). A random surrogate's call draws with a fixed key (its gradient does not depend on it)."""
    key = jax.random.key(0)
    call = (lambda x: surrogate(x, key)) if surrogate.needs_key else surrogate
    out = {"forward": call(x), "grad_x": jax.grad(lambda x: jnp.sum(call(x)))(x), "derivative": surrogate.derivative(x)}
    if hasattr(surrogate, "primitive"):
        out["primitive"] = surrogate.primitive(x)
    return out


def check_surrogate_case(case: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """One surrogate on its own against a reference at the points ``x``: ``forward`` (exactly where it spikes),
    ``grad_x`` (also against ``derivative``), ``primitive`` where given; and SpikingJelly's keywords and defaults of
    the class (``defaults``, None for a required one) against snnjax's."""
    surrogate = parse_surrogate(case["surrogate"])
    got = surrogate_outputs(surrogate, jnp.asarray(arrays["x"]))
    out: dict[str, Any] = {}
    if "forward" in arrays and surrogate.spiking:  # spikes (or spike counts): exactly
        out["forward_mismatches"] = int(np.sum(np.asarray(got["forward"]) != arrays["forward"]))
    elif "forward" in arrays:
        out["forward"] = rel_error(got["forward"], arrays["forward"])
    out["grad_x"] = rel_error(got["grad_x"], arrays["grad_x"])
    out["derivative"] = rel_error(got["derivative"], arrays["grad_x"])
    if "primitive" in arrays:
        out["primitive"] = rel_error(got["primitive"], arrays["primitive"])
    if "defaults" in case:
        mine = {f.name: None if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(type(surrogate))}
        out["defaults_differ"] = sorted(k for k in set(mine) | set(case["defaults"])
                                        if mine.get(k, "absent") != case["defaults"].get(k, "absent"))
    out["ok"] = (out.get("forward_mismatches", 0) == 0 and not out.get("defaults_differ")
                 and all(v <= TOLERANCE for k, v in out.items() if isinstance(v, float)))
    return out


PSN_CLASSES = {"PSN": PSN, "MaskedPSN": MaskedPSN, "SlidingPSN": SlidingPSN}


def check_psn_case(case: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """One parallel spiking neuron (``case["kind"]`` with SpikingJelly's ``kwargs`` and ``step_mode``; ``s``: one call
    per step) with the file's ``weight`` and ``bias``: its output (spikes exactly) and the gradients of
    ``sum(out * grad_out)`` with respect to the input, the weight and the bias; and the initial values SpikingJelly
    draws without randomness (``init_*``: the bias, SlidingPSN's ``exp_init`` weight)."""
    kwargs = dict(case["kwargs"])
    if "surrogate_function" in kwargs:
        kwargs["surrogate_function"] = parse_surrogate(kwargs["surrogate_function"])
    if case["kind"] != "PSN":  # PSN takes no step_mode
        kwargs["step_mode"] = case.get("step_mode", "m")
    node = PSN_CLASSES[case["kind"]](**kwargs, rngs=nnx.Rngs(0))
    out: dict[str, Any] = {"init_bias": rel_error(node.bias[...], arrays["init_bias"])}
    if case["kind"] == "SlidingPSN" and kwargs.get("exp_init", True):
        out["init_weight"] = rel_error(node.weight[...], arrays["init_weight"])
    node.weight.set_value(jnp.asarray(arrays["weight"]))
    node.bias.set_value(jnp.asarray(arrays["bias"]))

    def loss(node, x):  # single-step mode: one call per step, from an empty queue
        y = jnp.stack([node(x_t) for x_t in x]) if node.step_mode == "s" else node(x)
        return jnp.sum(y * jnp.asarray(arrays["grad_out"])), y

    step = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    (_, y), (g_node, g_x) = step(node, jnp.asarray(arrays["x"]))
    spiking = node.surrogate_function.spiking
    out.update({"spike_mismatches": int(np.sum(np.asarray(y) != arrays["out"]))} if spiking
               else {"out": rel_error(y, arrays["out"])})
    out.update(grad_x=rel_error(g_x, arrays["grad_x"]),
               grad_weight=rel_error(g_node.weight[...], arrays["grad_weight"]),
               grad_bias=rel_error(g_node.bias[...], arrays["grad_bias"]))
    out["ok"] = out.get("spike_mismatches", 0) == 0 and all(
        v <= TOLERANCE for k, v in out.items() if k != "spike_mismatches")
    return out


def catalogue_neuron(case: dict[str, Any]) -> BaseNode:
    """The multi-step ``snnjax.neurons`` module a catalogue case names (``class`` and SpikingJelly's ``kwargs``)."""
    cls = getattr(neurons, case["class"], None)
    if not (isinstance(cls, type) and issubclass(cls, BaseNode)):
        raise ValueError(f"case class {case['class']!r} is not a neuron of snnjax.neurons")
    kwargs = dict(case.get("kwargs", {}))
    if "surrogate_function" in kwargs:
        kwargs["surrogate_function"] = parse_surrogate(kwargs["surrogate_function"])
    if "act" in kwargs:  # LIAF's activation, by its jax.nn name
        kwargs["act"] = getattr(jax.nn, kwargs["act"])
    return cls(**kwargs, step_mode="m")


def check_catalogue_case(case: dict[str, Any], arrays: dict[str, np.ndarray], impl: str = "auto") -> dict[str, Any]:
    """Recompute one catalogue case (a neuron module by class name, its parameters from ``param/``): outputs,
    ``v_seq``, and the gradients of ``x`` and of every parameter (``grad/``). A catalogue neuron runs ``scan`` where
    ``impl`` names a kernel written for IF / LIF / PLIF only (``xla``, ``pallas``); ``native`` runs the kernel
    generated from its step (the result's ``impl`` says which ran)."""
    node = catalogue_neuron(case)
    if case.get("layout") == "TNCHW":  # SpikingJelly's channels-first steps: snnjax's are channels-last
        arrays = {k: np.moveaxis(a, 2, -1) if a.ndim == 5 else a for k, a in arrays.items()}
    node.impl = impl if impl == "auto" or node.kind is not None or dispatch.IMPLEMENTATIONS[impl].any_neuron else "scan"
    for name, value in case_arrays(arrays, "param/").items():
        getattr(node, name).set_value(jnp.asarray(value))
    graphdef, params, rest = nnx.split(node, nnx.Param, ...)
    x, gy = jnp.asarray(arrays["x"]), jnp.asarray(arrays["grad_spikes"])

    def loss(x, params):
        merged = nnx.merge(graphdef, params, rest)
        y = merged(x)
        return jnp.sum(y * gy), (y, merged.multi_step(x, return_v_seq=True)[1])

    try:
        (_, (y, v_seq)), (gx, gp) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, params)
    except ValueError as e:  # an explicit impl this neuron's step cannot be generated for: reported, not failed
        if node.impl == "auto" or "cannot run this neuron call" not in str(e):
            raise
        return {"class": case["class"], "not_run": f"impl={node.impl!r}: {e}", "ok": True}
    out = {"class": case["class"], "impl": dispatch.resolve_impl(node.impl, node.neuron, x)}
    if np.array_equal(arrays["spikes"], np.round(arrays["spikes"])):  # spikes (ternary ones, counts): exactly
        out["spike_mismatches"] = int(np.sum(np.asarray(y) != arrays["spikes"]))
    else:  # a readout's potentials, LIAF's analog outputs, a smooth surrogate's values
        out["outputs"] = rel_error(y, arrays["spikes"])
    out["grad_x"] = rel_error(gx, arrays["grad_x"])
    if "v_seq" in arrays:
        out["v_seq"] = rel_error(v_seq, arrays["v_seq"])
    grads = dict(nnx.to_flat_state(gp))
    expected = case_arrays(arrays, "grad/")
    if sorted(expected) != sorted(".".join(map(str, p)) for p in grads):
        raise ValueError(f"{case['class']}: the file has gradients of {sorted(expected)}, the module has parameters "
                         f"{sorted('.'.join(map(str, p)) for p in grads)}")
    for p, g in grads.items():
        out["grad_" + ".".join(map(str, p))] = rel_error(g[...], expected[".".join(map(str, p))])
    out["ok"] = out.get("spike_mismatches", 0) == 0 and all(
        v <= TOLERANCE for k, v in out.items() if k not in ("class", "impl", "spike_mismatches"))
    return out


def build_model(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[nnx.Module, jax.Array]:
    """The snnjax model a model case describes, and its input in library layout."""
    num_classes = arrays["logits_eval"].shape[-1]
    rngs = nnx.Rngs(0)
    if meta["model"] == "CIFAR10DVSVGG":
        x = arrays["x"]  # [N, T, C, H, W]
        nrn = meta.get("neuron", {})
        widths = meta["widths"]
        pools = meta.get("pools", DEFAULT_POOLS if len(widths) == len(DEFAULT_POOLS) else None)
        if pools is None:
            raise ValueError("CIFAR10DVSVGG case with non-default depth needs a 'pools' list in its json")
        dropout_keys = {k for k in arrays if k.startswith("init/classifier.")}
        model = CIFAR10DVSVGG(widths=widths, pools=pools, in_channels=x.shape[2], image_size=x.shape[-1],
                              num_classes=num_classes, dropout=0.0 if "init/classifier.0.weight" in dropout_keys
                              else 0.25, tau=nrn.get("tau", 1.333), decay_input=nrn.get("decay_input", False),
                              detach_reset=nrn.get("detach_reset", True), v_reset=nrn.get("v_reset", 0.0),
                              surrogate_function=parse_surrogate(nrn.get("surrogate", "atan2")), rngs=rngs)
        return model, jnp.asarray(x.transpose(1, 0, 3, 4, 2))
    if meta["model"] == "Spikformer":
        x = arrays["x"]  # [N, C, H, W], static image
        model = Spikformer(T=meta["T"], in_channels=x.shape[1], img_size_h=x.shape[-2], img_size_w=x.shape[-1],
                           patch_size=meta.get("patch_size", 16), num_classes=num_classes,
                           embed_dims=meta["embed_dims"], num_heads=meta["num_heads"],
                           mlp_ratio=meta.get("mlp_ratio", 4.0), depths=meta["depths"], rngs=rngs)
        return model, jnp.asarray(x.transpose(0, 2, 3, 1))
    if meta["model"] in _BY_OPTIONS:  # x: [N, C, H, W] static image, or [T, N, C, H, W] frames
        x = arrays["x"]
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["options"].items()}
        if "surrogate_function" in options:
            options["surrogate_function"] = parse_surrogate(options["surrogate_function"])
        model = _BY_OPTIONS[meta["model"]](T=meta["T"], in_channels=x.shape[-3], num_classes=num_classes,
                                           **options, rngs=rngs)
        return model, jnp.asarray(x.transpose((0, 2, 3, 1) if x.ndim == 4 else (0, 1, 3, 4, 2)))
    if meta["model"] in ("ResNet", "ParametricLIFNet"):
        x = arrays["x"]  # [T, N, C, H, W]
        if meta.get("input_layout") != "TNCHW":
            raise ValueError(f"{meta['model']} cases take input_layout TNCHW, got {meta.get('input_layout')!r}")
        nrn = meta["neuron"]
        neuron = dict(spiking_neuron=nrn["kind"], v_threshold=nrn.get("v_threshold", 1.0),
                      v_reset=nrn.get("v_reset", 0.0), detach_reset=nrn.get("detach_reset", False),
                      surrogate_function=parse_surrogate(nrn.get("surrogate", "sigmoid4")))
        if nrn["kind"] != "IF":  # the time constant: LIF's tau, PLIF's init_tau
            neuron.update({"tau" if nrn["kind"] == "LIF" else "init_tau": nrn.get("tau", 2.0),
                           "decay_input": nrn.get("decay_input", True)})
        if meta["model"] == "ResNet":
            model = ResNet(depth=meta["depth"], cnf=meta["cnf"], widths=meta["widths"],
                           stage_blocks=meta.get("stage_blocks"), in_channels=x.shape[2],
                           num_classes=num_classes, rngs=rngs, **neuron)
        else:
            if x.shape[-1] != x.shape[-2]:
                raise ValueError(f"ParametricLIFNet cases take square frames, got {x.shape[-2:]}")
            model = ParametricLIFNet(stages=meta["stages"], channels=meta["channels"],
                                     hidden_features=meta["hidden_features"], voting_size=meta["voting_size"],
                                     dropout=meta.get("dropout", 0.0), in_channels=x.shape[2], image_size=x.shape[-1],
                                     num_classes=num_classes, rngs=rngs, **neuron)
        return model, jnp.asarray(x.transpose(0, 1, 3, 4, 2))
    raise ValueError(f"unknown model {meta['model']!r} in reference file (known: CIFAR10DVSVGG, Spikformer, "
                     f"ResNet, ParametricLIFNet, {', '.join(_BY_OPTIONS)})")


# Models a case builds from its json's snnjax constructor ``options`` (a surrogate by name, e.g. ``rect2``).
_BY_OPTIONS = {"SpikeDrivenTransformer": SpikeDrivenTransformer, "QKFormer": QKFormer, "MSResNet": MSResNet,
               "MaxResNet": MaxResNet}


def _logits_error(logits: jax.Array, reference: np.ndarray) -> float:
    """Logits ``[T, N, K]`` against the reference's, or against its time mean ``[N, K]`` (models that return it)."""
    return rel_error(logits.mean(0) if reference.ndim == 2 else logits, reference)


def check_model_case(meta: dict[str, Any], arrays: dict[str, np.ndarray], impl: str = "auto") -> dict[str, Any]:
    """Import ``init/`` weights, recompute eval/train logits, loss, gradients and BN statistics.

    Every neuron of the model runs its multi-step path with ``impl``.
    """
    model, x = build_model(meta, arrays)
    for _, module in nnx.iter_modules(model):
        if isinstance(module, BaseNode):
            module.impl = impl
    sub = functools.partial(case_arrays, arrays)
    spikingjelly.import_state_dict(model, sub("init/"), dtype=jnp.float64)
    labels = jnp.asarray(arrays["labels"])

    model.eval()
    out = {"logits_eval": _logits_error(nnx.jit(lambda m, x: m(x))(model, x), arrays["logits_eval"])}

    model.train()

    loss_kind = meta.get("loss", "ce")
    if loss_kind not in ("ce", "mse"):
        raise ValueError(f"case loss must be 'ce' or 'mse', got {loss_kind!r}")

    def loss_fn(model):
        logits = model(x)
        if loss_kind == "mse":  # firing rates against one-hot labels (SpikingJelly's F.mse_loss)
            one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
            return jnp.mean(jnp.square(logits.mean(0) - one_hot)), logits
        return optax.softmax_cross_entropy_with_integer_labels(logits.mean(0), labels).mean(), logits

    (loss, logits), grads = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))(model)
    out["logits_train"] = _logits_error(logits, arrays["logits_train"])
    out["loss_train"] = rel_error(loss, arrays["loss_train"])

    flat_grads = dict(nnx.to_flat_state(grads))
    expected = spikingjelly.convert_state_dict(model, sub("grad/"))
    floor = NEGLIGIBLE_GRAD * float(np.sqrt(sum(np.sum(np.square(v)) for v in expected.values())))
    grad_errs = {".".join(map(str, p)): rel_error(flat_grads[p][...], v, floor) for p, v in expected.items()}
    missing = [p for p in flat_grads if p not in expected]
    out["grads_checked"] = len(grad_errs)
    out["grads_missing"] = len(missing)
    worst = max(grad_errs, key=grad_errs.get)
    out["grad_max"], out["grad_worst"] = grad_errs[worst], worst

    stats = dict(nnx.to_flat_state(nnx.state(model, nnx.BatchStat)))
    after = spikingjelly.convert_state_dict(model, sub("after_train_step_state/"))
    out["bn_state_max"] = max(rel_error(stats[p][...], v) for p, v in after.items() if p in stats)
    tracked = [k for k in sub("after_train_step_state/") if k.endswith("num_batches_tracked")]
    if tracked and all(np.array_equal(arrays["init/" + k], arrays["after_train_step_state/" + k]) for k in tracked):
        out["reference_note"] = ("num_batches_tracked did not advance between init/ and after_train_step_state/: "
                                 "the file's init/ BatchNorm statistics are not the pre-step values (a generator "
                                 "that saves torch buffers without copying them records post-step values), so "
                                 "bn_state cannot match; regenerate the file with copied arrays")
    out["ok"] = (missing == [] and all(out[k] <= TOLERANCE for k in
                                       ("logits_eval", "logits_train", "loss_train", "grad_max", "bn_state_max")))
    return out


def load(path: str | pathlib.Path) -> tuple[Any, np.lib.npyio.NpzFile]:
    """``(cases from FILE.json, arrays of FILE.npz)``, with clear errors for missing files."""
    path = pathlib.Path(path)
    meta_path = path.with_suffix(".json")
    for p in (path, meta_path):
        if not p.exists():
            raise FileNotFoundError(f"{p} not found (a reference file is FILE.npz plus its sibling FILE.json)")
    return json.loads(meta_path.read_text()), np.load(path, allow_pickle=False)


def iter_cases(cases, arrays, impl: str = "auto"):
    """Yield ``(name, result)`` for every case of a reference file, neurons run with ``impl``."""
    if isinstance(cases, list):
        for i, case in enumerate(cases):
            prefix = f"case{i:03d}/"
            arrays_i = case_arrays(arrays, prefix)
            if "class" in case:
                yield f"case{i:03d}", check_catalogue_case(case, arrays_i, impl)
                continue
            if case["kind"] == "surrogate":
                result = check_surrogate_case(case, arrays_i)
            elif case["kind"] in PSN_CLASSES:
                result = check_psn_case(case, arrays_i)
            else:
                result = check_neuron_case(case, arrays_i, impl)
            yield f"case{i:03d}", {"kind": case["kind"], **result}
    elif isinstance(cases, dict):
        for name, meta in cases.items():
            prefix = f"{name}/"
            yield name, {"model": meta["model"], **check_model_case(meta, case_arrays(arrays, prefix), impl)}
    else:
        raise ValueError("reference json must be a list of neuron cases or a mapping of model cases")


def check_file(path: str, impl: str = "auto") -> int:
    """Print one JSON line per case and a final ``{"cases": N, "failed": K}`` (and ``"not_run"``: the neuron cases
    an explicit ``impl`` cannot run, each saying why); return the exit code.

    ``impl`` (``auto``, ``xla``, ``pallas``, ``native``, ``scan``, ``assoc``) is the neurons' multi-step
    implementation (``snnjax.neurons.multistep``); ``pallas`` runs the kernels in interpret
    mode on a CPU. Catalogue neurons run ``scan`` where it names ``xla`` or ``pallas``; ``assoc`` runs the
    readouts (a declared linear recurrence), the other neurons are reported as not run.
    """
    if impl not in dispatch.IMPLS:
        raise ValueError(f"impl must be one of {dispatch.IMPLS}, got {impl!r}")
    jax.config.update("jax_enable_x64", True)
    # Random initial values are overwritten by the imported weights; rbg compiles far faster on CPU.
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        cases, arrays = load(path)
    except (FileNotFoundError, ValueError) as e:
        print(json.dumps({"error": str(e)}))
        return 2
    n = failed = not_run = 0
    for name, result in iter_cases(cases, arrays, impl):
        n += 1
        failed += not result["ok"]
        not_run += "not_run" in result
        print(json.dumps({"case": name, **result}), flush=True)
    print(json.dumps({"cases": n, "failed": failed, **({"not_run": not_run} if not_run else {})}))
    return 1 if failed else 0
