"""``plan`` a layout for a model on a mesh: inspectable data, and the shardings it implies.

    info = parallel.analyze(model)                         # neurons, parameters, tensor-parallel layers
    p = parallel.plan(model, mesh, mode="fsdp_tp")         # or mode="auto", objective="memory"
    print(p)                                               # each parameter's PartitionSpec and bytes per device
    state, step = snnjax.train.apply_plan(p, state, step_cfg, graphdef, tx)
    state, metrics = step(state, batch)

A plan is inspectable data: the strategy (``snnjax.parallel.rules``), the mesh
axis sizes, every parameter's layout (stored / compute / gradient / optimizer
``PartitionSpec``) with its bytes per device, the collectives the strategy
implies, and, for ``mode="auto"``, why that mode was chosen (``snnjax.parallel.auto``).
Planning needs no devices (``plan(model, 64, mode="fsdp")`` works on a laptop);
applying it (``snnjax.train.apply_plan``) does.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from snnjax.parallel import auto as auto_lib
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import neuron_paths, param_stream, pipeline_plan
from snnjax.parallel import rules as rules_lib
from snnjax.parallel import temporal as temporal_lib
from snnjax.parallel.analyze import tp_role
from snnjax.parallel.describe import format_plan, spec_str
from snnjax.parallel.layout import StepLayout
from snnjax.parallel.logical import logical_axes
from snnjax.parallel.pipeline import PipelineSpec
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.parallel.stage_params import StagePacking, leaf_stages
from snnjax.parallel.variables import flat_vars, is_var, path_str, split_state, value

OFFLOADS = ("none", "opt_state", "params", "all")  # what a plan keeps in host memory between steps (with_offload)

# -- plan ---------------------------------------------------------------------------------------

UNITS_HELP = (
    "mode 'pp' cuts the model into pipeline stages at its units, and {name} has no units() method. Define "
    "units() -> list[snnjax.models.units.Unit]: the model's forward as a chain, each Unit(name, owns, fn) with fn "
    "mapping the previous unit's output to its own (the first takes the input [T, N, ...], the last returns the "
    "logits) and owns the path prefixes of the variables it uses, e.g.\n"
    "    def units(self):\n"
    "        return [Unit('block0', ('conv0', 'bn0', 'lif0'), lambda x: self.lif0(self.bn0(self.conv0(x)))),\n"
    "                Unit('head', ('fc',), lambda x: self.fc(snnjax.layers.flatten_features(x)))]\n"
    "    def __call__(self, x):\n"
    "        return snnjax.models.units.run_units(self.units(), x)\n"
    "or build the model as snnjax.Sequential(...), whose units end after each spiking neuron")


@dataclasses.dataclass(frozen=True)
class ParamPlan:
    path: str
    shape: tuple[int, ...]
    dtype: str
    logical_axes: tuple | None
    layout: rules_lib.ArrayLayout
    bytes: int  # whole array
    param_bytes: int  # per device, as stored
    opt_bytes: int  # per device, one optimizer slot

    def as_dict(self) -> dict[str, Any]:
        lay = self.layout
        return {"path": self.path, "shape": list(self.shape), "dtype": self.dtype,
                "logical_axes": list(self.logical_axes) if self.logical_axes else None,
                "param_spec": spec_str(lay.param), "compute_spec": spec_str(lay.compute),
                "grad_spec": spec_str(lay.grad), "opt_spec": spec_str(lay.opt), "bytes": self.bytes,
                "param_bytes_per_device": self.param_bytes, "notes": list(lay.notes)}


def _local_bytes(shape, spec, axis_sizes, itemsize) -> int:
    shards = rules_lib.spec_shards(spec, axis_sizes, len(shape))
    return int(math.prod(n // s for n, s in zip(shape, shards, strict=True)) * itemsize)


@dataclasses.dataclass
class Plan:
    """A layout for one model on one mesh; ``print(plan)`` shows it, ``plan.as_dict()`` serialises it."""

    mode: str
    strategy: rules_lib.Strategy
    objective: str
    axis_sizes: dict[str, int]
    mesh: Mesh | None  # None: planned for devices this process does not have (inspection only)
    params: list[ParamPlan]
    opt_slots: int
    min_shard_size: int
    reasons: list[str]
    expected_collectives: list[dict[str, Any]]
    time_steps: int | None = None  # T, where given: checked to divide over the time axis
    time_blocks: int = 0  # neuron blocks of the temporal pipeline (0: automatic)
    pipeline: PipelineSpec | None = None  # mode "pp": the pipeline over ``stage`` (snnjax.parallel.pipeline)
    pipeline_summary: dict[str, Any] | None = None  # its schedule, bubble, stage inputs held (pipeline_plan.summary)
    packing: StagePacking | None = None  # mode "pp": each device stores its stages' parameters (stage_params)
    offload: str = "none"  # what lives in host memory between steps: none, opt_state, params or all (with_offload)
    # () -> neuron_paths.summary of the model on its batch: (neuron rows, convolution rows) (None: planned without
    # the model or input_shape)
    neuron_trace: Callable[[], tuple[list[dict], list[dict]]] | None = dataclasses.field(default=None, repr=False,
                                                                                      compare=False)

    @property
    def rules(self) -> Mapping[str, Any]:
        return self.strategy.rules

    @property
    def zero_stage(self) -> int:
        return self.strategy.zero_stage

    @property
    def temporal(self) -> dict[str, Any] | None:
        """The time split (``snnjax.parallel.temporal.summary``), None without one."""
        return temporal_lib.summary(self.axis_sizes.get("time", 1), self.time_steps, self.time_blocks,
                                    in_pipeline=self.mode == "pp")

    @functools.cached_property
    def _paths(self) -> tuple[list[dict], list[dict]] | tuple[None, None]:
        return (None, None) if self.neuron_trace is None else self.neuron_trace()

    @property
    def neurons(self) -> list[dict] | None:
        """Which path runs each neuron type of the model under this plan's mesh, and why (``neuron_paths.summary``:
        ``{"neuron", "layers", "impl", "why"}``); None where the plan was made without the model or ``input_shape``.
        Traced for shapes on first use."""
        return self._paths[0]

    @property
    def convolutions(self) -> list[dict] | None:
        """Which path runs the model's convolutions and linear layers on the CPU under this plan's mesh, and why
        (``conv_paths.summary``: ``{"kind", "path", "why", "layers"}``; empty on other backends); None as
        ``neurons``."""
        return self._paths[1]

    def with_offload(self, offload: str) -> Plan:
        """This plan with ``offload`` in host memory between steps: ``opt_state`` (the optimizer state),
        ``params`` (the parameters, each model unit's fetched to the device when it runs, forward and backward:
        ``snnjax.parallel.param_stream``) or ``all`` (both). The shardings keep their partitioning; only the
        memory kind changes. Raises ``ValueError`` for a layout that cannot stream its parameters."""
        if offload not in OFFLOADS:
            raise ValueError(f"offload must be one of {OFFLOADS}, got {offload!r}")
        if offload in param_stream.PARAM_OFFLOADS and self.packing is not None:
            raise ValueError(f"offload={offload!r} streams each model unit's parameters from host memory when the "
                             "unit runs, but under mode 'pp' every device stores its stages' parameters packed in "
                             "one row that each stage reads whole; use offload='opt_state' with the pipeline, or a "
                             "mode without one (e.g. fsdp) to offload the parameters")
        return dataclasses.replace(self, offload=offload)

    @property
    def streams_params(self) -> bool:
        """Whether the parameters live in host memory and each unit fetches its own (``with_offload``)."""
        return self.offload in param_stream.PARAM_OFFLOADS

    def layout_of(self, path: str) -> rules_lib.ArrayLayout:
        for p in self.params:
            if p.path == path:
                return p.layout
        raise KeyError(f"no parameter {path!r} in this plan")

    def row_axes(self, which: str = "param") -> tuple[str, ...]:
        """Mode ``pp``: the mesh axes within a stage that split a packed row of ``which`` (``param``, ``grad``,
        ``opt``): ``fsdp``, and ``data`` for the optimizer state under ZeRO-1/2 and the gradients under ZeRO-2."""
        zero = {"param": 3, "grad": 2, "opt": 1}[which] <= self.zero_stage
        return tuple(a for a in ("data", "fsdp") if self.axis_sizes[a] > 1 and (a == "fsdp" or zero))

    def row_sharding(self, which: str = "param") -> NamedSharding:
        """Mode ``pp``: the sharding of a packed ``[S, width]`` row array of ``which`` (see ``row_axes``)."""
        axes = self.row_axes(which)
        return NamedSharding(self._require_mesh(), PartitionSpec("stage", axes or None))

    def totals(self) -> dict[str, int]:
        total = sum(p.bytes for p in self.params)
        if self.packing is not None:  # one row of the packed parameters (and of each optimizer slot) per device
            row = self.packing.width * np.dtype(self.packing.dtype).itemsize

            def local(which: str) -> int:
                return row // math.prod(self.axis_sizes[a] for a in self.row_axes(which))

            return {"param_bytes": total, "param_bytes_per_device": local("param"),
                    "grad_bytes_per_device": local("grad"), "optimizer_bytes_per_device": self.opt_slots * local("opt"),
                    "optimizer_bytes_replicated": self.opt_slots * total}
        grad = sum(_local_bytes(p.shape, p.layout.grad, self.axis_sizes, np.dtype(p.dtype).itemsize)
                   for p in self.params)
        return {"param_bytes": total, "param_bytes_per_device": sum(p.param_bytes for p in self.params),
                "grad_bytes_per_device": grad,
                "optimizer_bytes_per_device": self.opt_slots * sum(p.opt_bytes for p in self.params),
                "optimizer_bytes_replicated": self.opt_slots * total}

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "strategy": self.strategy.description, "zero_stage": self.zero_stage,
                "sequence_parallel": self.strategy.sequence_parallel, "rules": {k: v for k, v in self.rules.items()},
                "objective": self.objective, "mesh": dict(self.axis_sizes), "reasons": list(self.reasons),
                "totals": self.totals(), "expected_collectives": self.expected_collectives, "temporal": self.temporal,
                "offload": self.offload, "neurons": self.neurons, "convolutions": self.convolutions,
                "params": [p.as_dict() for p in self.params]}

    def __str__(self) -> str:
        return format_plan(self)

    # -- shardings -----------------------------------------------------------------------------

    def _require_mesh(self) -> Mesh:
        if self.mesh is None:
            raise ValueError(f"this plan was made for {math.prod(self.axis_sizes.values())} devices that this "
                             f"process does not have ({jax.device_count()} available); plan again with a Mesh "
                             "to apply it")
        return self.mesh

    def _tree(self, params, which: str):
        mesh = self._require_mesh()
        by_path = {p.path: p.layout for p in self.params}

        def f(path, var):
            key = path_str(path)
            if key not in by_path:
                raise KeyError(f"parameter {key!r} is not in the plan (plan the same model you apply it to)")
            sharding = NamedSharding(mesh, getattr(by_path[key], which))
            return var.replace(sharding) if is_var(var) else sharding

        return jax.tree_util.tree_map_with_path(f, params, is_leaf=is_var)

    def param_shardings(self, params, which: str = "param"):
        """Shardings shaped like ``params``: ``which`` is ``param`` (stored), ``compute``, ``grad`` or ``opt``."""
        return self._tree(params, which)

    def model_state_shardings(self, model_state):
        """BatchNorm statistics and other non-parameter state follow their channels (tensor rules)."""
        mesh = self._require_mesh()

        def f(var):
            val = value(var)
            shape = tuple(np.shape(val))
            spec = rules_lib.state_spec(logical_axes(var), shape, self.strategy, self.axis_sizes)
            sharding = NamedSharding(mesh, spec)
            return var.replace(sharding) if is_var(var) else sharding

        return jax.tree.map(f, model_state, is_leaf=is_var)

    def opt_state_shardings(self, tx, opt_state, params):
        """Optimizer state: parameter-shaped parts as the plan's ``opt`` layout, the rest replicated."""
        mesh = self._require_mesh()
        opt = self.param_shardings(params, "opt")
        replicated = NamedSharding(mesh, PartitionSpec())
        return optax.tree_map_params(tx, lambda _, s: s, opt_state, opt,
                                     transform_non_params=lambda _: replicated, is_leaf=is_var)

    def state_shardings(self, state, tx):
        """Shardings of a ``TrainState`` (step and RNG streams replicated; packed pipeline rows over ``stage``)."""
        mesh = self._require_mesh()
        replicated = NamedSharding(mesh, PartitionSpec())
        if self.packing is not None and self.packing.is_packed(state.params):
            opt_rows = self.row_sharding("opt")
            return state.replace(step=replicated, params=self.row_sharding(),
                                 rngs=jax.tree.map(lambda _: replicated, state.rngs),
                                 model_state=self.model_state_shardings(state.model_state),
                                 opt_state=jax.tree.map(lambda x: opt_rows if self.packing.is_packed(x) else replicated,
                                                        state.opt_state))
        params = self.param_shardings(state.params)
        if self.streams_params:
            params = jax.tree.map(lambda s: s.with_memory_kind(param_stream.HOST_KIND), params)
        return state.replace(step=replicated, params=params,
                             rngs=jax.tree.map(lambda _: replicated, state.rngs),
                             model_state=self.model_state_shardings(state.model_state),
                             opt_state=self.opt_state_shardings(tx, state.opt_state, state.params))

    def batch_sharding(self, ndim: int, batch_axis: int = 0) -> NamedSharding:
        """An input array's sharding: ``batch_axis`` over ``data x fsdp``."""
        return mesh_lib.batch_sharding(self._require_mesh(), ndim, batch_axis)

    def step_layout(self, params) -> StepLayout:
        """The ``StepLayout`` the train / eval steps take for this plan (``params`` gives the tree's shape)."""
        if self.packing is not None and self.packing.is_packed(params):
            tree = self.packing.abstract_tree()
            kw = dict(mesh=self._require_mesh(), rules=self.rules, packing=self.packing,
                      params=self.param_shardings(tree, "compute"), grads=self.row_sharding("grad"))
        else:
            kw = dict(mesh=self._require_mesh(), rules=self.rules, params=self.param_shardings(params, "compute"),
                      grads=self.param_shardings(params, "grad"))
        if self.pipeline is not None:
            kw["pipeline"] = self.pipeline
        if self.streams_params:
            kw["stream_params"] = True
        if self.axis_sizes.get("time", 1) > 1:
            return temporal_lib.StepLayout(**kw, time_blocks=self.time_blocks)
        return StepLayout(**kw)


def _axis_sizes(mesh_or_count, mode: str | None) -> tuple[dict[str, int], Mesh | None]:
    """Axis sizes and (where this process has the devices) the mesh, from a Mesh, a mesh spec or a device count."""
    if isinstance(mesh_or_count, Mesh):
        sizes = {a: int(mesh_or_count.shape.get(a, 1)) for a in mesh_lib.AXES}
        extra = set(mesh_or_count.axis_names) - set(mesh_lib.AXES)
        if extra:
            raise ValueError(f"mesh axes {sorted(extra)} are not snnjax axes {list(mesh_lib.AXES)}; build the mesh "
                             "with snnjax.parallel.make_mesh")
        return sizes, mesh_or_count
    if isinstance(mesh_or_count, str):
        return mesh_lib.mesh_shape(mesh_or_count, jax.device_count()), mesh_lib.make_mesh(mesh_or_count)
    if isinstance(mesh_or_count, (int, np.integer)):
        sizes = auto_lib.default_axis_sizes(mode, int(mesh_or_count))
        return sizes, _mesh_if_available(sizes)
    raise TypeError(f"plan() takes a Mesh, a device count or a mesh spec string, got {type(mesh_or_count).__name__}")


def _mesh_if_available(sizes: Mapping[str, int], devices=None) -> Mesh | None:
    """A mesh of ``sizes`` over the first devices (or ``devices``); None if this process has too few."""
    total = math.prod(sizes.values())
    if devices is None:
        if total > jax.device_count():
            return None
        devices = jax.devices()[:total]
    return mesh_lib.make_mesh(",".join(f"{a}={s}" for a, s in sizes.items()), devices)


def _expected(strategy: rules_lib.Strategy, sizes: Mapping[str, int], params: list[ParamPlan],
              tp_layers: list[dict], n_bn: int, pp: bool = False) -> list[dict[str, Any]]:
    d, f, t = sizes["data"], sizes["fsdp"], sizes["tensor"]
    local = sum(_local_bytes(p.shape, p.layout.compute, sizes, np.dtype(p.dtype).itemsize) for p in params)
    out = []
    fsdp = strategy.fsdp and f > 1
    if fsdp:
        out.append({"kind": "all-gather", "over": ("fsdp",), "what": "parameters before the forward", "bytes": local})
        out.append({"kind": "reduce-scatter", "over": ("fsdp",) + (("data",) if d > 1 else ()),
                    "what": "gradients to their shards", "bytes": local})
    if d > 1:
        shard = local // (f if fsdp else 1)
        if strategy.zero_stage == 0:
            if not fsdp:
                out.append({"kind": "all-reduce", "over": ("data",), "what": "gradients", "bytes": shard})
        else:
            kind = "reduce-scatter" if strategy.zero_stage >= 2 else "all-reduce"
            out.append({"kind": kind, "over": ("data",), "what": f"gradients (ZeRO-{strategy.zero_stage})",
                        "bytes": shard})
            out.append({"kind": "all-gather", "over": ("data",), "what": "updated parameters from optimizer shards",
                        "bytes": shard})
    if t > 1 and strategy.tensor:
        rows = sum(1 for x in tp_layers if x["role"] == "row")
        cols = sum(1 for x in tp_layers if x["role"] == "column")
        out.append({"kind": "all-reduce", "over": ("tensor",), "count": rows,
                    "what": f"outputs of the {rows} row-parallel layers (forward)", "bytes": None})
        out.append({"kind": "all-reduce", "over": ("tensor",), "count": cols,
                    "what": f"input gradients of the {cols} column-parallel layers (backward)", "bytes": None})
    if sizes.get("time", 1) > 1:
        out.append({"kind": "all-reduce", "over": ("time",), "what": "gradients (each time shard sees its steps)",
                    "bytes": local})
        exchange = temporal_lib.summary(sizes["time"], None, 0, in_pipeline=pp)["exchange"]
        out.append({"kind": exchange, "over": ("time",), "what": "membrane potentials to the next time "
                    "shard (forward) and their gradients back (backward), one neuron block per tick", "bytes": None})
    if d * f * sizes.get("time", 1) > 1 and n_bn:
        over = tuple(a for a in ("data", "fsdp", "time") if sizes.get(a, 1) > 1)
        out.append({"kind": "all-reduce", "over": over, "count": n_bn,
                    "what": f"batch statistics of the {n_bn} BatchNorm layers (synchronised, as on one device)",
                    "bytes": None})
    return out


def _pipeline_layout(model: nnx.Module, stages: int, options: PipelineOptions, global_batch_size: int | None,
                     batch_shards: int, input_shape, compute_dtype,
                     row_shards: int) -> tuple[PipelineSpec, list[str], StagePacking]:
    """The pipeline over ``stages`` devices (``pipeline_plan.make_spec``) and where its parameters are stored."""
    spec, why = pipeline_plan.make_spec(model, stages, options, global_batch_size=global_batch_size,
                                        batch_shards=batch_shards, input_shape=input_shape,
                                        dtype=compute_dtype or np.float32)
    tree = nnx.split(model, nnx.Param, ...)[1]  # as the train state holds it
    owner_stage = leaf_stages(tree, [u.owns for u in model.units()], spec.layout)
    return spec, why, StagePacking.build(tree, [g % stages for g in owner_stage], stages, row_shards)


def plan(model_or_state, mesh_or_device_count: Mesh | int | str, *, objective: str = "speed",
         mode: str | None = None, zero_stage: int | None = None, sequence_parallel: bool = False,
         global_batch_size: int | None = None, opt_slots: int = 2, min_shard_size: int = 0,
         memory_budget_bytes: int | None = None, time_steps: int | None = None, time_blocks: int = 0,
         pipeline: PipelineOptions | None = None, input_shape: tuple[int, ...] | None = None,
         compute_dtype=None) -> Plan:
    """A layout for ``model_or_state`` (an ``nnx.Module``, a ``TrainState`` or a parameter ``State``).

    ``mesh_or_device_count``: a ``Mesh`` (its axes are used as given), a mesh spec (``"fsdp=4,tensor=2"``)
    or a device count (the mode's usual mesh). ``mode``: ``None`` (the mode the mesh's axes imply),
    ``"auto"`` (chosen from ``objective`` and the sizes; needs a device count) or a mode of
    ``snnjax.parallel.MODES``. ``zero_stage`` adds ZeRO-1/2 over ``data`` to any mode that uses it;
    ``sequence_parallel`` also splits row-parallel layers' outputs over ``tensor`` (tensor-parallel modes).
    ``opt_slots``: optimizer arrays per parameter (Adam 2, SGD with momentum 1) for the byte estimates.
    ``min_shard_size``: parameters with fewer elements stay unsharded by FSDP / ZeRO.
    ``time_steps`` / ``time_blocks``: with a mesh axis ``time`` > 1 (temporal parallelism, any mode), T is
    checked to divide over it and the neurons are pipelined over ``time_blocks`` blocks (0: automatic).
    ``mode="auto"`` considers a pipeline (``snnjax.parallel.auto.choose``) when ``pipeline`` is given.
    ``mode="pp"``: a pipeline over the mesh's ``stage`` axis (``pipeline``: schedule, virtual stages,
    microbatches, layout; ``snnjax.parallel.pipeline_plan``), each stage using the other axes as the
    mode they imply would (``hybrid`` rules for data x fsdp x tensor). Needs the model (its units);
    ``input_shape`` (the batch ``[T, N, ...]``) and ``compute_dtype`` let the split balance compiled cost, and
    ``plan.neurons`` and ``plan.convolutions`` (printed with the plan) say which path runs each neuron type and the
    CPU convolutions and linear layers under this mesh, and why.
    Raises ``ValueError`` saying what to change for layouts that cannot work.
    """
    if objective not in auto_lib.OBJECTIVES:
        raise ValueError(f"objective must be one of {list(auto_lib.OBJECTIVES)}, got {objective!r}")
    params, model_state, _ = split_state(model_or_state)
    entries = []
    for path, var in flat_vars(params):
        val = value(var)
        entries.append((path, tuple(np.shape(val)), np.dtype(val.dtype), logical_axes(var),
                        int(np.size(val)) * np.dtype(val.dtype).itemsize))
    if not entries:
        raise ValueError("the model has no parameters to plan")
    has_tp = any(names and {"mlp", "heads"} & set(names) for *_, names, _ in entries)
    reasons: list[str] = []

    @functools.cache  # auto's choice and the pp plan share one layout (its unit costs are compiled)
    def pipeline_layout(stages: int, batch_shards: int, row_shards: int):
        return _pipeline_layout(model_or_state, stages, pipeline or PipelineOptions(), global_batch_size, batch_shards,
                                input_shape, compute_dtype, row_shards)

    auto = mode == "auto"
    if auto:
        if isinstance(mesh_or_device_count, Mesh):
            n = mesh_or_device_count.size
        elif isinstance(mesh_or_device_count, str):
            n = math.prod(mesh_lib.mesh_shape(mesh_or_device_count, jax.device_count()).values())
        else:
            n = int(mesh_or_device_count)
        budget = memory_budget_bytes if memory_budget_bytes is not None else auto_lib.device_memory_bytes()
        pipeline_bytes = None
        if pipeline is not None and isinstance(model_or_state, nnx.Module):
            def pipeline_bytes(stages: int) -> int | None:
                try:
                    _, _, packing = pipeline_layout(stages, n // stages, 1)
                except ValueError:  # too few units, a batch that does not split into microbatches, mixed dtypes
                    return None
                return packing.width * np.dtype(packing.dtype).itemsize * (2 + opt_slots)
        mode, sizes, reasons = auto_lib.choose(n, sum(e[-1] for e in entries), opt_slots, has_tp, objective, budget,
                                               global_batch_size, pipeline_bytes)
        given = isinstance(mesh_or_device_count, Mesh) and n <= jax.device_count()
        mesh = _mesh_if_available(sizes, list(mesh_or_device_count.devices.flat) if given else None)
    else:
        sizes, mesh = _axis_sizes(mesh_or_device_count, mode)
        if mode is None:
            mode = auto_lib.infer_mode(sizes)
            reasons.append(f"mode {mode!r} follows from the mesh's axes")
    if auto and sequence_parallel and not rules_lib.STRATEGIES[mode].tensor:
        reasons.append(f"sequence_parallel ignored: {mode!r} uses no tensor parallelism")
        sequence_parallel = False
    pp = mode == "pp"
    if pp:
        if sizes["stage"] < 2:
            example = rules_lib.both("parallel.mesh=stage=2,data=-1", "the layout 'stage=2,data=-1'")
            raise ValueError(f"mode 'pp' pipelines over the mesh axis stage, which is {sizes['stage']} in mesh "
                             f"{dict(sizes)}; give it size > 1 (e.g. {example})")
        if not isinstance(model_or_state, nnx.Module):
            raise ValueError("mode 'pp' splits the model's units (model.units()) into stages: plan the nnx.Module, "
                             "not its state")
        if not callable(getattr(model_or_state, "units", None)):
            raise ValueError(UNITS_HELP.format(name=type(model_or_state).__name__))
        if sequence_parallel:
            raise ValueError("sequence_parallel is not available with mode 'pp': its halo exchanges are "
                             "collective-permutes inside the pipeline's per-stage branches, which XLA:CPU runs as a "
                             "rendezvous of every device (a deadlock); set sequence_parallel=False")
        inner = auto_lib.infer_mode({**sizes, "stage": 1})
        strategy = rules_lib.get_strategy(inner, zero_stage, sequence_parallel)
        rules_lib.check_mesh(strategy, {**sizes, "stage": 1})
    else:
        strategy = rules_lib.get_strategy(mode, zero_stage, sequence_parallel)
        rules_lib.check_mesh(strategy, sizes)
    if strategy.tensor and sizes["tensor"] > 1 and not has_tp:
        why = (f"tensor={sizes['tensor']} splits only parameters with the logical names 'mlp' or 'heads', and this "
               "model has none: every parameter stays whole on each tensor device, which all compute the same "
               "thing. Annotate its layers (snnjax.parallel.annotate, or axes=... of snnjax.layers.conv2d / linear) "
               "or move those devices to data/fsdp")
        warnings.warn(why, stacklevel=2)
        reasons.append(why)
    temporal_lib.check(sizes.get("time", 1), time_steps, time_blocks)
    if time_blocks and sizes.get("time", 1) > 1 and input_shape is not None and isinstance(model_or_state, nnx.Module):
        temporal_lib.neuron_schedules(model_or_state, tuple(input_shape), sizes["time"], compute_dtype or np.float32,
                                      time_blocks)  # a block count that fits no layer fails here, naming the layer
    if global_batch_size is not None:
        shards = sizes["data"] * sizes["fsdp"]
        if global_batch_size % shards:
            raise ValueError(f"the global batch of {global_batch_size} does not divide over data x fsdp = {shards} "
                             f"devices; use a multiple of {shards} or move devices to the tensor axis")
    plans = []
    for path, shape, dtype, names, nbytes in entries:
        if names is not None and len(names) != len(shape):
            raise ValueError(f"parameter {path} has shape {shape} but logical names {names}; fix its annotation")
        lay = rules_lib.array_layout(names, shape, strategy, sizes, min_shard_size=min_shard_size)
        plans.append(ParamPlan(path, shape, str(dtype), names, lay, nbytes,
                               _local_bytes(shape, lay.param, sizes, dtype.itemsize),
                               _local_bytes(shape, lay.opt, sizes, dtype.itemsize)))
    tp_layers = [{"role": tp_role(names)} for path, *_, names, _ in entries
                 if path.endswith("kernel") and tp_role(names)]
    n_bn = sum(1 for path, var in flat_vars(model_state) if isinstance(var, nnx.BatchStat) and path.endswith("mean"))
    expected = _expected(strategy, sizes, plans, tp_layers, n_bn, pp)
    spec, summary, packing = None, None, None
    if pp:
        # Rows pad to a multiple of the devices that may split them: fsdp, and data under ZeRO.
        row_shards = sizes["fsdp"] * (sizes["data"] if strategy.zero_stage else 1)
        spec, why, packing = pipeline_layout(sizes["stage"], sizes["data"] * sizes["fsdp"], row_shards)
        reasons += why
        summary = pipeline_plan.summary(spec, [u.name for u in model_or_state.units()])
    neuron_trace = None
    if input_shape is not None and isinstance(model_or_state, nnx.Module):
        neuron_trace = functools.partial(neuron_paths.summary, model_or_state, tuple(input_shape), dict(sizes),
                                         compute_dtype or np.float32, time_blocks)
    return Plan(mode=mode, strategy=strategy, objective=objective, axis_sizes=sizes, mesh=mesh, params=plans,
                opt_slots=opt_slots, min_shard_size=min_shard_size, reasons=reasons, expected_collectives=expected,
                time_steps=time_steps, time_blocks=time_blocks, pipeline=spec, pipeline_summary=summary,
                packing=packing if pp else None, neuron_trace=neuron_trace)


