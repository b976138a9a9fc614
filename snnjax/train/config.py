"""Training configuration: one ``ml_collections.ConfigDict`` schema, its loader and its validation.

Config files (``configs/*.py``) start from ``base_config()`` and override values. ``load`` is the one
way every command and test reads a config: a config file, or a run's saved ``config.json``, with
``--config.KEY=VALUE`` overrides that can only set keys that exist. ``validate`` checks every
enumerated value and cross-field constraint before anything runs, naming the key and the allowed values.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import ml_collections

from snnjax.data import ENCODERS, SOURCE_NAMES
from snnjax.data.registry import OPTION_TYPES, dataset
from snnjax.data.source import ON_CORRUPT
from snnjax.models import remat
from snnjax.models.registry import REGISTRY, check_model_kwargs
from snnjax.parallel.auto import OBJECTIVES
from snnjax.parallel.mesh import parse_mesh_spec
from snnjax.parallel.pipeline import SCHEDULES as PIPELINE_SCHEDULES
from snnjax.parallel.rules import MODES as _STRATEGY_MODES
from snnjax.train.metrics import parse_log_to
from snnjax.train.profiling import parse_steps

DTYPES = ("float32", "bfloat16", "float64")
LOSSES = ("ce", "tet", "mse")
TRAIN_METHODS = ("bptt", "ottt", "sltt")  # snnjax/train/online.py
OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine", "warmup_cosine")
OFFLOADS = ("none", "opt_state", "params", "all", "auto")
NONFINITE = ("stop", "skip")  # what a step with a NaN/inf loss or gradient does (snnjax/train/loop.py)
# none, dp, zero1, zero2, fsdp, tp, fsdp_tp, dp_tp, hybrid (see snnjax.parallel.rules), and auto.
PARALLEL_MODES = (*_STRATEGY_MODES, "pp", "auto")


def base_config() -> ml_collections.ConfigDict:
    """Every key a training config may set, with defaults."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.dtype = "float32"  # compute dtype; params stay float32 except under float64

    c.model = ml_collections.ConfigDict({"name": "mlp"})  # the rest: the model constructor's keywords
    c.data = ml_collections.ConfigDict()
    c.data.name = "digits"
    # Where a dataset that reads files finds them; "" or "None" unsets it. A dataset that reads no
    # files (digits, synthetic_dvs) ignores it, so a config's location never blocks switching data.name.
    c.data.data_dir = ml_collections.config_dict.placeholder(str)
    c.data.time_steps = 4  # T; event datasets integrate into T frames
    c.data.encoder = "direct"  # static images -> spikes over T: direct repetition or poisson
    # One typed slot per option of any dataset (snnjax/data/registry.py), None = the dataset's default;
    # the chosen dataset gets the options it takes, and the others set are ignored with a note.
    c.data.options = ml_collections.ConfigDict(
        {k: ml_collections.config_dict.placeholder(t) for k, t in OPTION_TYPES.items()})
    c.data.prefetch = 2
    # An example whose file turns out corrupt while training: "error" stops the run with the reader's error naming
    # the file; "skip" trains on the next readable example in its place, with a warning naming the file, and counts
    # it (metrics.jsonl's skipped_examples, summary.json's). snnjax/data/source.py: OnCorrupt.
    c.data.on_corrupt = "error"

    c.global_batch_size = 64
    c.num_epochs = 10
    c.num_steps = -1  # > 0 overrides num_epochs
    c.grad_accum_steps = 1
    c.loss = "ce"  # cross-entropy of the time-mean logits, TET, or mse (firing rates against one-hot labels)
    c.tet_lambda = 0.0  # TET's MSE weight (towards phi = 1)
    # How gradients cross time (snnjax/train/online.py): bptt (backpropagation through time); ottt or sltt, one time
    # step at a time with memory constant in T (the loss is config.loss of each step's logits, gradients summed over
    # steps; ottt takes weight gradients from OTTTLIFNode traces). online_updates: the optimizer applies every time
    # step's gradient (T updates per batch), SpikingJelly's online=True.
    c.train_method = "bptt"
    c.online_updates = False

    c.optimizer = "adam"
    c.learning_rate = 1e-3
    c.weight_decay = 0.0
    c.momentum = 0.9  # sgd only
    c.schedule = "cosine"
    c.warmup_steps = 0
    c.grad_clip_norm = 0.0  # 0: no clipping
    # A step whose loss or gradient norm is NaN/inf: "stop" raises an error naming the step (nothing after
    # it is saved), "skip" leaves parameters, optimizer state and BatchNorm statistics as they were and goes on.
    c.nonfinite = "stop"

    c.log_every_steps = 20
    # where the logged scalars go besides metrics.jsonl: tensorboard, wandb, mlflow, comma-separated ("" none);
    # wandb and mlflow are extras (pip install 'snnjax[wandb]'); snnjax/train/metrics.py says where each writes
    c.log_to = "tensorboard"
    # (first, last) steps, 1-based, traced with jax.profiler into WORKDIR/profile (TensorBoard's profile plugin,
    # ui.perfetto.dev); the time split by op kind goes to the log and metrics.jsonl (profile/<kind>_ms). () = none.
    c.profile_steps = ()
    c.eval_every_steps = -1  # -1: after every epoch
    c.checkpoint_every_steps = 200
    c.keep_checkpoints = 3
    c.resume = False

    c.parallel = ml_collections.ConfigDict()
    c.parallel.mode = "dp"
    c.parallel.mesh = "data=-1"  # axis=size pairs over data/fsdp/tensor/stage/time; one may be -1 (ignored by auto)
    # Temporal parallelism (mesh axis time > 1, e.g. mesh=time=4,data=2): neuron blocks of the pipeline, 0 = automatic
    c.parallel.time_blocks = 0
    c.parallel.zero_stage = -1  # ZeRO stage over data: -1 the mode's own (zero1: 1, zero2: 2, else 0), or 0/1/2
    c.parallel.sequence_parallel = False  # TP modes: also split row-parallel outputs over tensor (less memory)
    c.parallel.objective = "speed"  # what mode=auto optimises: speed or memory
    c.parallel.min_shard_size = 0  # parameters with fewer elements stay unsharded by FSDP / ZeRO
    # Activation checkpointing per model unit (snnjax/models/remat.py): none, units, dots_saveable or spikes for
    # every unit, or per unit as "stages.0=units,blocks.0=spikes" (the others none); and how layers after a neuron
    # keep their spike inputs for the backward: float, int8 or bits
    c.parallel.remat = "none"
    c.parallel.spike_residuals = "float"
    # > 0: the memory search (snnjax/train/memory_search.py) picks the fastest checkpointing plan (policy per unit,
    # spike storage; with mode=pp also the microbatch count) whose compiled peak per device fits this many MiB;
    # parallel.remat must then stay "none". Mode auto also plans its layout for this device memory.
    c.parallel.memory_budget_mb = 0.0
    # What lives in host memory between steps (FSDP's cpu_offload; snnjax/train/offload.py): none, opt_state (the
    # optimizer state), params (the parameters; each model unit's are fetched to the device when it runs, forward and
    # backward: snnjax/parallel/param_stream.py), all (both), or auto (with memory_budget_mb: the search offloads the
    # optimizer state when no checkpointing plan fits on its own). On the CPU backend host and device memory are the
    # same RAM: opt_state / params / all run the transfers and save nothing, auto never offloads.
    c.parallel.offload = "none"
    # mode=pp: a pipeline over the mesh axis stage (e.g. mesh=stage=2,data=-1); each stage uses the other axes
    c.parallel.pp = ml_collections.ConfigDict()
    c.parallel.pp.schedule = "1f1b"  # gpipe, 1f1b, interleaved, zero_bubble
    c.parallel.pp.virtual_stages = 1  # > 1: the interleaved schedule's stages per device
    c.parallel.pp.microbatches = 0  # 0: chosen from the batch (snnjax/parallel/pipeline_plan.py)
    c.parallel.pp.layout = ""  # units per (virtual) stage, e.g. "2|3|3|2"; "": balanced by compiled cost
    c.parallel.print_summary = False  # print per-device memory and collectives of the compiled step
    # At each evaluation, log every spiking neuron's firing rate on the first eval batch (snnjax/monitor.py) to
    # metrics.jsonl and TensorBoard as firing_rate/<neuron path>
    c.monitor = ml_collections.ConfigDict({"firing_rates": False})
    return c


class ConfigError(ValueError):
    """A config file or a ``--config.KEY=VALUE`` override that cannot be applied (the message names which)."""


def load(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """The config at ``path`` with ``overrides`` applied (not validated: ``validate`` is the trainer's entry check).

    ``path``: a config file (``configs/*.py``, whose ``get_config()`` is called), a run's saved ``config.json``,
    or a run's directory (``train.py --workdir RUN``: its ``config.json``). ``overrides``: ``"--config.KEY=VALUE"``
    (or ``"KEY=VALUE"``) with a dotted KEY that must exist; VALUE is read as the key's type (text for a string,
    a Python literal for a tuple), ``None`` sets None.

    Raises:
      FileNotFoundError: no config file at ``path`` (the message names it).
      ConfigError: the file has no ``get_config()``, or an override names no key or has a bad value.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: {path.parent} is not a training run's directory "
                                    "(train.py --workdir RUN writes config.json there)")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist (--config takes a configs/*.py file or a run's "
                                "config.json)")
    c = _read_json(path) if path.suffix == ".json" else _read_module(path)
    for item in overrides:
        apply_override(c, item)
    return c


def _read_module(path: pathlib.Path) -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"config file {path} is not a Python file (configs/*.py) or a config.json")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"config file {path} defines no get_config() (see configs/digits.py)")
    return module.get_config()


def _read_json(path: pathlib.Path) -> ml_collections.ConfigDict:
    """A saved ``config.json`` (``Trainer`` writes it into the run's directory) over ``base_config()``."""
    saved = json.loads(path.read_text())
    c = base_config()
    model = saved.pop("model", {"name": c.model.name})  # JSON's lists back to the config's tuples
    c.model = ml_collections.ConfigDict({k: tuple(v) if isinstance(v, list) else v for k, v in model.items()})
    try:
        c.update_from_flattened_dict(_flatten(saved))
    except (KeyError, AttributeError, TypeError) as e:
        raise ConfigError(f"{path} is not a config this version reads ({e})") from None
    return c


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
    return out


def apply_override(c: ml_collections.ConfigDict, item: str) -> None:
    """Set one ``--config.KEY=VALUE`` (or ``KEY=VALUE``) on ``c`` (``ConfigError`` naming the key if it cannot)."""
    key, sep, text = item.removeprefix("--config.").partition("=")
    if not sep or not key:
        raise ConfigError(f"{item}: write --config.KEY=VALUE")
    *parents, leaf = key.split(".")
    node = c
    for i, part in enumerate(parents):
        child = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
        if not isinstance(child, ml_collections.ConfigDict):
            where = ".".join(parents[:i + 1])
            raise ConfigError(f"--config.{key}: the config has no key {key} ({where} is not a group of keys)")
        node = child
    if leaf not in node:
        group = ".".join(parents) or "the config"
        raise ConfigError(f"--config.{key}: the config has no key {key}; {group} has {sorted(node.keys())}")
    kind = node.get_type(leaf)
    if kind is ml_collections.ConfigDict:
        raise ConfigError(f"--config.{key}: {key} is a group of keys; set them one by one ({sorted(node[leaf])})")
    value = _parse(key, text, kind)
    with node.unlocked():
        try:
            node[leaf] = value
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--config.{key}={text}: {e}") from None


def _parse(key: str, text: str, kind: type) -> Any:
    """``text`` as a value of type ``kind`` (the key's current type); ``None`` is None."""
    if text == "None":
        return None
    if kind is str:
        return text
    if kind is bool:
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise ConfigError(f"--config.{key}={text}: {key} is True or False")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"--config.{key}={text}: {key} is a number ({kind.__name__})") from None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if kind in (tuple, list):
            raise ConfigError(f"--config.{key}={text}: {key} is a tuple, e.g. (256,) or (4,4,8)") from None
        return text  # a word for a key whose value was None
    if kind in (tuple, list):
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return value


def _choice(key: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"config.{key}={value!r} is not allowed; choose one of {list(allowed)}")


def _positive(key: str, value, *, zero_ok: bool = False) -> None:
    if not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"config.{key} must be {'>= 0' if zero_ok else '> 0'}, got {value!r}")


def validate(c: ml_collections.ConfigDict) -> None:
    """Raise ``ValueError`` (naming the key and the allowed values) for an invalid config."""
    unknown = sorted(set(c.keys()) - set(base_config().keys()))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; allowed: {sorted(base_config().keys())}")
    _choice("dtype", c.dtype, DTYPES)
    _choice("loss", c.loss, LOSSES)
    _choice("train_method", c.train_method, TRAIN_METHODS)
    _choice("online_updates", c.online_updates, (True, False))
    _check_online(c)
    _choice("optimizer", c.optimizer, OPTIMIZERS)
    _choice("schedule", c.schedule, SCHEDULES)
    _choice("nonfinite", c.nonfinite, NONFINITE)
    _choice("data.name", c.data.name, SOURCE_NAMES)
    _choice("data.encoder", c.data.encoder, tuple(ENCODERS))
    _choice("data.on_corrupt", c.data.on_corrupt, ON_CORRUPT)
    _choice("model.name", c.model.name, tuple(REGISTRY))
    _choice("parallel.mode", c.parallel.mode, PARALLEL_MODES)
    _choice("parallel.objective", c.parallel.objective, OBJECTIVES)
    _choice("parallel.zero_stage", c.parallel.zero_stage, (-1, 0, 1, 2))
    _positive("parallel.min_shard_size", c.parallel.min_shard_size, zero_ok=True)
    _check_time_axis(c)
    _check_pipeline(c)
    remat_settings(c)
    _positive("parallel.memory_budget_mb", c.parallel.memory_budget_mb, zero_ok=True)
    _choice("parallel.offload", c.parallel.offload, OFFLOADS)
    unknown = sorted(set(c.monitor.keys()) - set(base_config().monitor.keys()))
    if unknown:
        raise ValueError(f"config.monitor has no key(s) {unknown}; allowed: {sorted(base_config().monitor)}")
    _choice("monitor.firing_rates", c.monitor.firing_rates, (True, False))
    parse_steps(c.profile_steps, name="config.profile_steps")
    parse_log_to(c.log_to)
    if c.parallel.offload == "auto" and c.parallel.memory_budget_mb <= 0:
        raise ValueError("config.parallel.offload='auto' lets the memory search decide, which needs "
                         "config.parallel.memory_budget_mb > 0; or set parallel.offload to 'none' or 'opt_state'")
    if c.parallel.offload in ("params", "all"):
        if c.parallel.mode == "pp":
            raise ValueError(f"config.parallel.offload={c.parallel.offload!r} streams each model unit's parameters "
                             "from host memory when the unit runs, but mode 'pp' stores each device's stages' "
                             "parameters packed in one row that every stage reads whole; use "
                             "parallel.offload='opt_state' with pp, or another mode (e.g. fsdp) to offload the "
                             "parameters")
        if c.parallel.memory_budget_mb > 0:
            raise ValueError(f"config.parallel.offload={c.parallel.offload!r}: the memory search "
                             "(parallel.memory_budget_mb > 0) does not model parameters streamed from host memory; "
                             "set memory_budget_mb=0, or offload 'opt_state' / 'auto' with the search")
    if c.parallel.memory_budget_mb > 0 and (str(c.parallel.remat).strip() != "none"
                                            or c.parallel.spike_residuals != "float"):
        raise ValueError("config.parallel.memory_budget_mb > 0 lets the memory search choose parallel.remat and "
                         "parallel.spike_residuals; leave those at 'none' / 'float', or set memory_budget_mb=0")
    check_model_kwargs(c.model.name, {k: v for k, v in c.model.items() if k != "name"})
    unknown = sorted(set(c.data.options.keys()) - set(OPTION_TYPES))
    if unknown:
        raise ValueError(f"config.data.options has no key(s) {unknown}; the datasets' options are "
                         f"{sorted(OPTION_TYPES)} (snnjax/data/registry.py)")
    for key in ("global_batch_size", "grad_accum_steps", "data.time_steps", "log_every_steps",
                "checkpoint_every_steps", "keep_checkpoints", "learning_rate"):
        _positive(key, c[key] if "." not in key else c.data[key.split(".")[1]])
    _check_temporal_delete(c)
    for key in ("weight_decay", "tet_lambda", "grad_clip_norm", "warmup_steps"):
        _positive(key, c[key], zero_ok=True)
    if c.num_steps <= 0 and c.num_epochs <= 0:
        raise ValueError("set config.num_epochs > 0 or config.num_steps > 0")
    if c.global_batch_size % c.grad_accum_steps:
        raise ValueError(f"config.global_batch_size={c.global_batch_size} must divide by "
                         f"config.grad_accum_steps={c.grad_accum_steps}")


def temporal_delete(c: ml_collections.ConfigDict) -> int:
    """``data.options.temporal_delete`` where the dataset takes it and it is set (> 0), else 0."""
    if "temporal_delete" not in dataset(c.data.name).options:
        return 0
    return c.data.options.get("temporal_delete") or 0


def _check_temporal_delete(c: ml_collections.ConfigDict) -> None:
    """The training frames kept by a temporal delete are no more than the ``data.time_steps`` built."""
    keep = c.data.options.get("temporal_delete")
    if keep is not None and keep < 0:
        raise ValueError(f"config.data.options.temporal_delete must be >= 0 (0: off), got {keep}")
    if temporal_delete(c) > c.data.time_steps:
        raise ValueError(f"config.data.options.temporal_delete={keep} keeps more frames than the "
                         f"config.data.time_steps={c.data.time_steps} built per example; set temporal_delete to at "
                         f"most {c.data.time_steps} (Python: temporal_delete= / time_steps= of get_source)")


def _check_online(c: ml_collections.ConfigDict) -> None:
    """``train_method`` ottt / sltt: one time step at a time, so no split of time, no pipeline, no accumulation."""
    if c.train_method == "bptt":
        if c.online_updates:
            raise ValueError("config.online_updates=True applies each time step's gradient, which only the online "
                             "methods compute; set config.train_method='ottt' or 'sltt', or online_updates=False")
        return
    what = f"config.train_method={c.train_method!r} runs the time steps one after another in one step"
    if c.parallel.mode in ("pp", "auto"):
        raise ValueError(f"{what}; config.parallel.mode={c.parallel.mode!r} is not supported with it: choose dp, "
                         "fsdp, tp, ... (or train_method='bptt')")
    if parse_mesh_spec(c.parallel.mesh).get("time", 1) not in (1, -1):
        raise ValueError(f"{what}, so it cannot split time over devices: drop time from config.parallel.mesh="
                         f"{c.parallel.mesh!r}")
    if c.grad_accum_steps != 1:
        raise ValueError(f"{what} over the whole batch; set config.grad_accum_steps=1")
    if c.parallel.memory_budget_mb > 0:
        raise ValueError(f"{what}: its memory does not grow with T and the memory search (parallel.memory_budget_mb)"
                         " plans backpropagation through time; set parallel.memory_budget_mb=0")


def _check_time_axis(c: ml_collections.ConfigDict) -> None:
    """``parallel.time_blocks`` >= 0, and T divides over the mesh's ``time`` axis (temporal parallelism)."""
    if not isinstance(c.parallel.time_blocks, int) or c.parallel.time_blocks < 0:
        raise ValueError(f"config.parallel.time_blocks must be an integer >= 0 (0: automatic), "
                         f"got {c.parallel.time_blocks!r}")
    time = parse_mesh_spec(c.parallel.mesh).get("time", 1)
    if time == 1 or time == -1:
        return
    if c.parallel.mode == "auto":
        raise ValueError(f"config.parallel.mesh={c.parallel.mesh!r} splits time, but mode 'auto' plans its own mesh "
                         "and does not choose temporal parallelism; give a mode (e.g. dp, hybrid)")
    if c.data.time_steps % time:
        raise ValueError(f"config.data.time_steps={c.data.time_steps} does not divide over the mesh axis time={time} "
                         f"(config.parallel.mesh={c.parallel.mesh!r}); use a multiple of {time}")
    keep = temporal_delete(c)
    if keep and keep % time:
        raise ValueError(f"config.data.options.temporal_delete={keep}: the training steps' {keep} time steps do not "
                         f"divide over the mesh axis time={time} (config.parallel.mesh={c.parallel.mesh!r}); use a "
                         f"multiple of {time}")


def remat_settings(c: ml_collections.ConfigDict) -> remat.MemorySettings:
    """``parallel.remat`` / ``parallel.spike_residuals`` as ``MemorySettings`` (unit names are checked on the model)."""
    text = str(c.parallel.remat).strip()
    try:
        if "=" in text:
            per_unit = dict(part.strip().split("=", 1) for part in text.split(",") if part.strip())
            return remat.settings({k.strip(): v.strip() for k, v in per_unit.items()}, c.parallel.spike_residuals)
        return remat.settings(text, c.parallel.spike_residuals)
    except ValueError as e:
        raise ValueError(f"config.parallel.remat={c.parallel.remat!r} / config.parallel.spike_residuals="
                         f"{c.parallel.spike_residuals!r}: {e} (per unit: 'UNIT=POLICY,...')") from None


def _check_pipeline(c: ml_collections.ConfigDict) -> None:
    """``parallel.pp.*`` values, and the mesh / accumulation they need."""
    pp = c.parallel.pp
    unknown = sorted(set(pp.keys()) - set(base_config().parallel.pp.keys()))
    if unknown:
        raise ValueError(f"config.parallel.pp has no key(s) {unknown}; allowed: {sorted(base_config().parallel.pp)}")
    _choice("parallel.pp.schedule", pp.schedule, PIPELINE_SCHEDULES)
    _positive("parallel.pp.virtual_stages", pp.virtual_stages)
    _positive("parallel.pp.microbatches", pp.microbatches, zero_ok=True)
    stage = parse_mesh_spec(c.parallel.mesh).get("stage", 1)
    if c.parallel.mode == "pp":
        if stage == 1:
            raise ValueError(f"config.parallel.mode='pp' needs the mesh axis stage > 1, but config.parallel.mesh="
                             f"{c.parallel.mesh!r}; e.g. --config.parallel.mesh=stage=2,data=-1")
        if c.grad_accum_steps != 1:
            raise ValueError("config.parallel.mode='pp' splits the batch into microbatches itself; set "
                             "config.grad_accum_steps=1 and config.parallel.pp.microbatches instead")
    elif stage not in (1, -1) and c.parallel.mode != "auto":
        raise ValueError(f"config.parallel.mesh={c.parallel.mesh!r} has stage={stage}, which only mode 'pp' uses; set "
                         "--config.parallel.mode=pp or drop stage from the mesh")


def source_kwargs(c: ml_collections.ConfigDict) -> tuple[dict[str, Any], list[str]]:
    """``get_source`` keywords for ``c.data`` (besides name and split), and notes on what it leaves out.

    A config's data settings belong to the dataset it was written for, so switching ``data.name``
    must not trip over them: a ``data_dir`` for a dataset that reads no files, options the dataset
    does not take and an encoder for event frames are left out, each with a note. ``data_dir`` ""
    or "None" (``--config.data.data_dir=`` / ``=None``) means unset.
    """
    entry = dataset(c.data.name)
    name, notes = c.data.name, []
    data_dir = c.data.data_dir if c.data.data_dir not in ("", "None") else None
    if data_dir is not None and not entry.reads_files:
        notes.append(f"{name} reads no files; ignoring data.data_dir={data_dir!r}")
        data_dir = None
    options = {k: v for k, v in c.data.options.items() if v is not None}
    ignored = sorted(set(options) - set(entry.options))
    if ignored:
        notes.append(f"{name} takes no option(s) {ignored}; ignoring "
                     + ", ".join(f"data.options.{k}={options.pop(k)!r}" for k in ignored))
    if entry.events and c.data.encoder != base_config().data.encoder:
        notes.append(f"{name} gives event frames, which need no encoder; ignoring data.encoder={c.data.encoder!r}")
    if options.get("temporal_delete"):
        notes.append(f"data.options.temporal_delete={options['temporal_delete']}: examples are built with "
                     f"data.time_steps={c.data.time_steps} frames; training steps see {options['temporal_delete']} "
                     f"of them (a sorted random subset per example), evaluation all {c.data.time_steps}")
    return {"data_dir": data_dir, "time_steps": c.data.time_steps, **options}, notes
