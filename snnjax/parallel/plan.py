"""``analyze`` a model, ``plan`` a layout for it on a mesh, ``apply`` the plan to a train state.

    info = parallel.analyze(model)                         # neurons, parameters, tensor-parallel layers
    p = parallel.plan(model, mesh, mode="fsdp_tp")         # or mode="auto", objective="memory"
    print(p)                                               # each parameter's PartitionSpec and bytes per device
    state, step = parallel.apply(p, state, step_cfg, graphdef, tx)
    state, metrics = step(state, batch)

A plan is inspectable data: the strategy (``snnjax.parallel.rules``), the mesh
axis sizes, every parameter's layout (stored / compute / gradient / optimizer
``PartitionSpec``) with its bytes per device, the collectives the strategy
implies, and, for ``mode="auto"``, why that mode was chosen. Planning needs no
devices (``plan(model, 64, mode="fsdp")`` works on a laptop); applying does.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import rules as rules_lib
from snnjax.parallel.logical import logical_axes

OBJECTIVES = ("speed", "memory")


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def _path_str(path) -> str:
    if path and getattr(path[-1], "name", None) == "value":  # a Variable's value
        path = path[:-1]
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


def _value(var):
    return var.get_value() if _is_var(var) else var


def _split(model_or_state):
    """``(params, model_state, opt_state)`` of a model, a TrainState or a parameter State."""
    if isinstance(model_or_state, nnx.Module):
        _, params, _, rest = nnx.split(model_or_state, nnx.Param, nnx.RngState, ...)
        return params, rest, None
    if hasattr(model_or_state, "params") and hasattr(model_or_state, "opt_state"):
        return model_or_state.params, model_or_state.model_state, model_or_state.opt_state
    return model_or_state, None, None


def _flat_vars(tree) -> list[tuple[str, Any]]:
    if tree is None:
        return []
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_var)[0]
    return [(_path_str(p), v) for p, v in leaves]


# -- analyze ------------------------------------------------------------------------------------


def _tp_role(names) -> str | None:
    """``column`` / ``row`` for a kernel tensor parallelism splits (kernels are ``[*in, *out]``; a row-parallel
    layer's output dim is whole), else None."""
    if not names or not {"mlp", "heads"} & set(names) or len(names) < 2:
        return None
    return "row" if names[-1] in ("embed", "classes") else "column"


def analyze(model: nnx.Module) -> dict[str, Any]:
    """What a parallel plan works with: ``neurons``, ``parameters`` (path, shape, dtype, logical names),
    ``tp_layers`` (layers tensor parallelism splits: column- or row-parallel, kernel shape) and
    ``unannotated`` parameters (no logical names: never tensor-split)."""
    from snnjax.neurons.modules import BaseNode

    neurons = []
    for path, module in nnx.iter_modules(model):
        if isinstance(module, BaseNode):
            cfg = module.config
            neurons.append({"path": ".".join(map(str, path)), "kind": cfg.kind, "step_mode": module.step_mode,
                            "v_threshold": cfg.v_threshold, "v_reset": cfg.v_reset,
                            "surrogate": type(cfg.surrogate).__name__})
    params = []
    for path, var in _flat_vars(nnx.state(model, nnx.Param)):
        val = _value(var)
        params.append({"path": path, "shape": tuple(np.shape(val)), "dtype": str(np.dtype(val.dtype)),
                       "size": int(np.size(val)), "logical_axes": logical_axes(var)})
    tp_layers = [{"layer": p["path"].rsplit(".", 1)[0], "role": _tp_role(p["logical_axes"]),
                  "kernel_shape": p["shape"], "logical_axes": p["logical_axes"]}
                 for p in params if p["path"].endswith("kernel") and _tp_role(p["logical_axes"])]
    unannotated = [p["path"] for p in params if p["logical_axes"] is None and p["shape"]]
    return {"model": type(model).__name__, "num_params": sum(p["size"] for p in params),
            "param_bytes": sum(p["size"] * np.dtype(p["dtype"]).itemsize for p in params),
            "neurons": neurons, "parameters": params, "tp_layers": tp_layers, "unannotated": unannotated}


# -- plan ---------------------------------------------------------------------------------------


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
                "param_spec": _spec_str(lay.param), "compute_spec": _spec_str(lay.compute),
                "grad_spec": _spec_str(lay.grad), "opt_spec": _spec_str(lay.opt), "bytes": self.bytes,
                "param_bytes_per_device": self.param_bytes, "notes": list(lay.notes)}


def _spec_str(spec: PartitionSpec) -> str:
    return "(" + ", ".join("-" if e is None else (e if isinstance(e, str) else "+".join(e)) for e in spec) + ")"


def _local_bytes(shape, spec, axis_sizes, itemsize) -> int:
    shards = rules_lib.spec_shards(spec, axis_sizes, len(shape))
    return int(math.prod(n // s for n, s in zip(shape, shards)) * itemsize)


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

    @property
    def rules(self) -> Mapping[str, Any]:
        return self.strategy.rules

    @property
    def zero_stage(self) -> int:
        return self.strategy.zero_stage

    def layout_of(self, path: str) -> rules_lib.ArrayLayout:
        for p in self.params:
            if p.path == path:
                return p.layout
        raise KeyError(f"no parameter {path!r} in this plan")

    def totals(self) -> dict[str, int]:
        total = sum(p.bytes for p in self.params)
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
                "totals": self.totals(), "expected_collectives": self.expected_collectives,
                "params": [p.as_dict() for p in self.params]}

    def __str__(self) -> str:
        t = self.totals()
        mesh = " x ".join(f"{k}={v}" for k, v in self.axis_sizes.items() if v > 1) or "1 device"
        sp = ", sequence parallel" if self.strategy.sequence_parallel else ""
        lines = [f"plan: mode={self.mode} (zero_stage={self.zero_stage}{sp}) on {mesh}: {self.strategy.description}"]
        lines += [f"  why: {r}" for r in self.reasons]
        w = max([len(p.path) for p in self.params] + [9])
        lines.append(f"  {'parameter':<{w}}  {'shape':<18} {'logical axes':<34} {'stored':<22} {'optimizer':<22} "
                     f"{'bytes/device':>12}")
        for p in self.params:
            names = "(" + ", ".join(n or "-" for n in p.logical_axes) + ")" if p.logical_axes else "(unnamed)"
            lines.append(f"  {p.path:<{w}}  {str(p.shape):<18} {names:<34} {_spec_str(p.layout.param):<22} "
                         f"{_spec_str(p.layout.opt):<22} {p.param_bytes:>12,}")
            for note in p.layout.notes:
                lines.append(f"  {'':<{w}}    note: {note}")
        lines.append(f"  per device: parameters {t['param_bytes_per_device']:,} B (of {t['param_bytes']:,}), "
                     f"gradients {t['grad_bytes_per_device']:,} B, optimizer ({self.opt_slots} slots) "
                     f"{t['optimizer_bytes_per_device']:,} B (replicated: {t['optimizer_bytes_replicated']:,})")
        for c in self.expected_collectives:
            size = f"{c['bytes']:,} B" if c.get("bytes") is not None else "activation-sized"
            lines.append(f"  expect {c['kind']} over {'x'.join(c['over'])}: {c['what']} ({size})")
        return "\n".join(lines)

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
            key = _path_str(path)
            if key not in by_path:
                raise KeyError(f"parameter {key!r} is not in the plan (plan the same model you apply it to)")
            sharding = NamedSharding(mesh, getattr(by_path[key], which))
            return var.replace(sharding) if _is_var(var) else sharding

        return jax.tree_util.tree_map_with_path(f, params, is_leaf=_is_var)

    def param_shardings(self, params, which: str = "param"):
        """Shardings shaped like ``params``: ``which`` is ``param`` (stored), ``compute``, ``grad`` or ``opt``."""
        return self._tree(params, which)

    def model_state_shardings(self, model_state):
        """BatchNorm statistics and other non-parameter state follow their channels (tensor rules)."""
        mesh = self._require_mesh()

        def f(var):
            val = _value(var)
            shape = tuple(np.shape(val))
            spec = rules_lib.state_spec(logical_axes(var), shape, self.strategy, self.axis_sizes)
            sharding = NamedSharding(mesh, spec)
            return var.replace(sharding) if _is_var(var) else sharding

        return jax.tree.map(f, model_state, is_leaf=_is_var)

    def opt_state_shardings(self, tx, opt_state, params):
        """Optimizer state: parameter-shaped parts as the plan's ``opt`` layout, the rest replicated."""
        import optax

        mesh = self._require_mesh()
        opt = self.param_shardings(params, "opt")
        replicated = NamedSharding(mesh, PartitionSpec())
        return optax.tree_map_params(tx, lambda _, s: s, opt_state, opt,
                                     transform_non_params=lambda _: replicated, is_leaf=_is_var)

    def state_shardings(self, state, tx):
        """Shardings of a ``TrainState`` (step and RNG streams replicated)."""
        mesh = self._require_mesh()
        replicated = NamedSharding(mesh, PartitionSpec())
        return state.replace(step=replicated, params=self.param_shardings(state.params),
                             rngs=jax.tree.map(lambda _: replicated, state.rngs),
                             model_state=self.model_state_shardings(state.model_state),
                             opt_state=self.opt_state_shardings(tx, state.opt_state, state.params))

    def batch_sharding(self, ndim: int, batch_axis: int = 0) -> NamedSharding:
        """An input array's sharding: ``batch_axis`` over ``data x fsdp``."""
        return mesh_lib.batch_sharding(self._require_mesh(), ndim, batch_axis)


def _axis_sizes(mesh_or_count, mode: str | None) -> tuple[dict[str, int], Mesh | None]:
    if isinstance(mesh_or_count, Mesh):
        sizes = {a: int(mesh_or_count.shape.get(a, 1)) for a in mesh_lib.AXES}
        extra = set(mesh_or_count.axis_names) - set(mesh_lib.AXES)
        if extra:
            raise ValueError(f"mesh axes {sorted(extra)} are not snnjax axes {list(mesh_lib.AXES)}; build the mesh "
                             "with snnjax.parallel.make_mesh")
        return sizes, mesh_or_count
    if isinstance(mesh_or_count, str):
        n = jax.device_count()
        sizes = mesh_lib.mesh_shape(mesh_or_count, n)
        return sizes, mesh_lib.make_mesh(mesh_or_count)
    if isinstance(mesh_or_count, (int, np.integer)):
        n = int(mesh_or_count)
        if n < 1:
            raise ValueError(f"device count must be >= 1, got {n}")
        sizes = dict.fromkeys(mesh_lib.AXES, 1)
        if mode in ("dp", "zero1", "zero2", None):
            sizes["data"] = n
        elif mode == "fsdp":
            sizes["fsdp"] = n
        elif mode == "tp":
            sizes["tensor"] = n
        elif mode in ("fsdp_tp", "dp_tp"):
            if n % 2 or n < 4:
                raise ValueError(f"mode {mode!r} on {n} devices: give a Mesh or a mesh spec (e.g. "
                                 f"'{'fsdp' if mode == 'fsdp_tp' else 'data'}=-1,tensor=2'); {n} devices do not "
                                 "split into tensor=2 and the rest")
            sizes["tensor"] = 2
            sizes["fsdp" if mode == "fsdp_tp" else "data"] = n // 2
        elif mode == "hybrid":
            raise ValueError("mode 'hybrid' takes its axes from the mesh; pass a Mesh or a mesh spec like "
                             "'data=2,fsdp=2,tensor=2'")
        elif mode != "none":
            rules_lib.get_strategy(mode)  # raises for unknown modes
        if mode == "none":
            sizes = dict.fromkeys(mesh_lib.AXES, 1)
        total = math.prod(sizes.values())
        mesh = None
        if total <= jax.device_count():
            spec = ",".join(f"{a}={s}" for a, s in sizes.items())
            mesh = mesh_lib.make_mesh(spec, jax.devices()[:total])
        return sizes, mesh
    raise TypeError(f"plan() takes a Mesh, a device count or a mesh spec string, got {type(mesh_or_count).__name__}")


def infer_mode(axis_sizes: Mapping[str, int]) -> str:
    """The named mode that uses exactly the mesh's axes of size > 1."""
    used = {a for a in ("data", "fsdp", "tensor") if axis_sizes.get(a, 1) > 1}
    return {frozenset(): "none", frozenset({"data"}): "dp", frozenset({"fsdp"}): "fsdp",
            frozenset({"data", "fsdp"}): "fsdp", frozenset({"tensor"}): "tp",
            frozenset({"fsdp", "tensor"}): "fsdp_tp", frozenset({"data", "fsdp", "tensor"}): "hybrid",
            frozenset({"data", "tensor"}): "dp_tp"}[frozenset(used)]


def _memory_budget() -> int | None:
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def _auto(n: int, info: list[tuple], opt_slots: int, has_tp: bool, objective: str, budget: int | None,
          global_batch_size: int | None) -> tuple[str, dict[str, int], list[str]]:
    """Pick mode and mesh for ``n`` devices; returns ``(mode, axis_sizes, reasons)``."""
    total = sum(b for *_, b in info)
    sizes = dict.fromkeys(mesh_lib.AXES, 1)
    if n == 1:
        return "none", sizes, ["one device: nothing to split"]
    reasons = []
    batch_shards = math.gcd(n, global_batch_size) if global_batch_size else n
    tensor = n // batch_shards
    if tensor > 1:
        if not has_tp:
            raise ValueError(f"the global batch of {global_batch_size} splits over only {batch_shards} of {n} "
                             "devices and the model has no tensor-parallel layers; use a batch size that is a "
                             f"multiple of {n}")
        reasons.append(f"the global batch of {global_batch_size} splits over {batch_shards} devices; the other "
                       f"factor {tensor} goes to tensor parallelism")
    replicated = total * (2 + opt_slots)  # parameters, gradients, optimizer slots
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    if objective == "memory":
        sizes.update(fsdp=batch_shards, tensor=tensor)
        reasons.append(f"objective=memory: FSDP shards parameters, gradients and optimizer state {batch_shards} ways "
                       f"({mib(replicated)} replicated -> about {mib(replicated / batch_shards)} per device) and the "
                       "batch (so activations) as well")
        mode = "fsdp" if tensor == 1 else "fsdp_tp"
        if batch_shards == 1:
            sizes.update(fsdp=1)
            mode = "tp"
        return mode, sizes, reasons
    limit = 0.5 * budget if budget else None
    if limit is None or replicated <= limit:
        sizes.update(data=batch_shards, tensor=tensor)
        why = "no memory limit is known for this backend" if limit is None else \
            f"{mib(replicated)} of replicated state fits half the device memory ({mib(budget)})"
        reasons.append(f"objective=speed: data parallelism needs one gradient all-reduce per step, the least "
                       f"communication; {why}")
        mode = "dp" if tensor == 1 else ("dp_tp" if batch_shards > 1 else "tp")
        return mode, sizes, reasons
    sharded2 = total + (total + opt_slots * total) / batch_shards
    if sharded2 <= limit and tensor == 1:
        sizes.update(data=batch_shards)
        reasons.append(f"objective=speed: replicated state ({mib(replicated)}) exceeds half the device memory; "
                       f"ZeRO-2 keeps parameters whole but shards gradients and optimizer state ({mib(sharded2)})")
        return "zero2", sizes, reasons
    sizes.update(fsdp=batch_shards, tensor=tensor)
    reasons.append(f"objective=speed: even ZeRO-2 ({mib(sharded2)}) exceeds half the device memory; FSDP shards "
                   "the parameters too")
    return ("fsdp" if tensor == 1 else "fsdp_tp"), sizes, reasons


def _expected(strategy: rules_lib.Strategy, sizes: Mapping[str, int], params: list[ParamPlan],
              tp_layers: list[dict], n_bn: int) -> list[dict[str, Any]]:
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
    if d * f > 1 and n_bn:
        out.append({"kind": "all-reduce", "over": ("data", "fsdp"), "count": n_bn,
                    "what": f"batch statistics of the {n_bn} BatchNorm layers (synchronised, as on one device)",
                    "bytes": None})
    return out


def plan(model_or_state, mesh_or_device_count: Mesh | int | str, *, objective: str = "speed",
         mode: str | None = None, zero_stage: int | None = None, sequence_parallel: bool = False,
         global_batch_size: int | None = None, opt_slots: int = 2, min_shard_size: int = 0,
         memory_budget_bytes: int | None = None) -> Plan:
    """A layout for ``model_or_state`` (an ``nnx.Module``, a ``TrainState`` or a parameter ``State``).

    ``mesh_or_device_count``: a ``Mesh`` (its axes are used as given), a mesh spec (``"fsdp=4,tensor=2"``)
    or a device count (the mode's usual mesh). ``mode``: ``None`` (the mode the mesh's axes imply),
    ``"auto"`` (chosen from ``objective`` and the sizes; needs a device count) or a mode of
    ``snnjax.parallel.MODES``. ``zero_stage`` adds ZeRO-1/2 over ``data`` to any mode that uses it;
    ``sequence_parallel`` also splits row-parallel layers' outputs over ``tensor`` (tensor-parallel modes).
    ``opt_slots``: optimizer arrays per parameter (Adam 2, SGD with momentum 1) for the byte estimates.
    ``min_shard_size``: parameters with fewer elements stay unsharded by FSDP / ZeRO.
    Raises ``ValueError`` saying what to change for layouts that cannot work.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    params, model_state, _ = _split(model_or_state)
    entries = []
    for path, var in _flat_vars(params):
        val = _value(var)
        entries.append((path, tuple(np.shape(val)), np.dtype(val.dtype), logical_axes(var),
                        int(np.size(val)) * np.dtype(val.dtype).itemsize))
    if not entries:
        raise ValueError("the model has no parameters to plan")
    has_tp = any(names and {"mlp", "heads"} & set(names) for *_, names, _ in entries)
    reasons: list[str] = []
    auto = mode == "auto"
    if auto:
        if isinstance(mesh_or_device_count, Mesh):
            n = mesh_or_device_count.size
        elif isinstance(mesh_or_device_count, str):
            n = math.prod(mesh_lib.mesh_shape(mesh_or_device_count, jax.device_count()).values())
        else:
            n = int(mesh_or_device_count)
        budget = memory_budget_bytes if memory_budget_bytes is not None else _memory_budget()
        mode, sizes, reasons = _auto(n, entries, opt_slots, has_tp, objective, budget, global_batch_size)
        spec = ",".join(f"{a}={s}" for a, s in sizes.items())
        mesh = mesh_lib.make_mesh(spec, jax.devices()[:n]) if n <= jax.device_count() else None
        if isinstance(mesh_or_device_count, Mesh) and mesh is not None:
            mesh = mesh_lib.make_mesh(spec, list(mesh_or_device_count.devices.flat))
    else:
        sizes, mesh = _axis_sizes(mesh_or_device_count, mode)
        if mode is None:
            mode = infer_mode(sizes)
            reasons.append(f"mode {mode!r} follows from the mesh's axes")
    if auto and sequence_parallel and not rules_lib.STRATEGIES[mode].tensor:
        reasons.append(f"sequence_parallel ignored: {mode!r} uses no tensor parallelism")
        sequence_parallel = False
    strategy = rules_lib.get_strategy(mode, zero_stage, sequence_parallel)
    rules_lib.check_mesh(strategy, sizes)
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
    tp_layers = [{"role": _tp_role(names)} for path, *_, names, _ in entries
                 if path.endswith("kernel") and _tp_role(names)]
    n_bn = sum(1 for path, var in _flat_vars(model_state) if isinstance(var, nnx.BatchStat) and path.endswith("mean"))
    expected = _expected(strategy, sizes, plans, tp_layers, n_bn)
    return Plan(mode=mode, strategy=strategy, objective=objective, axis_sizes=sizes, mesh=mesh, params=plans,
                opt_slots=opt_slots, min_shard_size=min_shard_size, reasons=reasons, expected_collectives=expected)


# -- apply --------------------------------------------------------------------------------------


def step_layout(p: Plan, params):
    """The ``StepLayout`` the train / eval steps take for plan ``p``."""
    from snnjax.train.step import StepLayout

    mesh = p._require_mesh()
    return StepLayout(mesh=mesh, rules=p.rules, params=p.param_shardings(params, "compute"),
                      grads=p.param_shardings(params, "grad"))


def apply(p: Plan, state, cfg, graphdef, tx, *, batch_axes: Mapping[str, int] | None = None,
          batch_ndims: Mapping[str, int] | None = None, donate: bool = True):
    """Shard ``state`` (a ``TrainState``) as ``p`` says; returns ``(state, step)``, ``step`` the jitted
    ``train_step(cfg, graphdef, tx, ...)`` with the plan's in/out shardings.

    ``batch_axes`` / ``batch_ndims``: each batch entry's batch axis and rank (e.g. ``{"inputs": 1,
    "labels": 0}`` and ``{"inputs": 5, "labels": 1}``) to fix the batch's input shardings; without them
    the batch keeps the shardings it arrives with (``plan.batch_sharding`` builds them).
    With ``donate`` (default) each step reuses its input state's buffers; arrays of ``state`` that
    ``device_put`` did not need to move are donated too, so do not reuse ``state`` after the first step.
    """
    from snnjax.train.step import train_step

    shardings = p.state_shardings(state, tx)
    state = jax.device_put(state, shardings)
    layout = step_layout(p, state.params)
    batch_sh = None
    if batch_axes is not None:
        if batch_ndims is None or set(batch_ndims) != set(batch_axes):
            raise ValueError("give batch_ndims for the same keys as batch_axes")
        batch_sh = {k: p.batch_sharding(batch_ndims[k], batch_axes[k]) for k in batch_axes}
    step = jax.jit(functools.partial(train_step, cfg, graphdef, tx, layout=layout),
                   in_shardings=(shardings, batch_sh), out_shardings=(shardings, None),
                   donate_argnums=(0,) if donate else ())
    return state, step


def eval_fn(p: Plan, state, cfg, graphdef):
    """The jitted ``eval_step`` under plan ``p`` (parameters gathered as in training)."""
    from snnjax.train.step import eval_step

    layout = step_layout(p, state.params)
    return jax.jit(functools.partial(eval_step, cfg, graphdef, layout=layout))


def describe_shardings(tree, *, title: str | None = None) -> str:
    """A table of every array in ``tree``: path, shape, dtype and its sharding's PartitionSpec."""
    rows = [title] if title else []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(x, "shape"):
            continue
        spec = getattr(getattr(x, "sharding", None), "spec", None)
        rows.append(f"  {_path_str(path):<40} {str(tuple(x.shape)):<18} {str(x.dtype):<8} "
                    f"{_spec_str(spec) if spec is not None else type(getattr(x, 'sharding', None)).__name__}")
    return "\n".join(rows)


__all__ = ["OBJECTIVES", "ParamPlan", "Plan", "analyze", "apply", "describe_shardings", "eval_fn", "infer_mode", "plan",
           "step_layout"]
