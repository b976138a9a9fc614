"""Strategies as rule tables: logical axis names -> mesh axes, plus where FSDP / ZeRO add shards.

A strategy is data, not a code path. Each has

* a rule table mapping logical names (``snnjax.parallel.logical``) to mesh axes:
  the batch always goes to ``(data, fsdp)``, time to ``time``; tensor-parallel strategies add
  ``mlp`` and ``heads`` -> ``tensor``;
* ``fsdp``: parameters (and so gradients and optimizer state) also sharded over
  ``fsdp`` on their largest divisible dimension (ZeRO-3);
* ``zero_stage`` over ``data``: 1 shards the optimizer state over ``data`` as
  well, 2 also the gradients (they are constrained to that layout before the
  update, so XLA reduce-scatters them instead of all-reducing);
* which mesh axes it needs (> 1) and which it may use; anything else must be 1;
* optionally sequence parallelism: activation rules that also split the row-parallel
  layers' outputs over ``tensor`` (less activation memory, more communication).

A dimension whose size does not divide its mesh axes stays replicated (and the
plan says so); no mesh axis shards two dimensions of one array.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from jax.sharding import PartitionSpec

# Temporal parallelism: the time steps of activations over the ``time`` axis, in every strategy (a no-op
# while it is 1); the neurons then run as a pipeline (``snnjax.neurons.kernels.temporal``).
TIME_RULES: dict[str, str] = {"time": "time"}
BATCH_RULES: dict[str, str | tuple[str, ...]] = {"batch": ("data", "fsdp"), **TIME_RULES}
TP_RULES: dict[str, str] = {"mlp": "tensor", "heads": "tensor"}
# Sequence parallelism (opt-in on top of TP): the outputs of row-parallel convolutions are split over
# ``tensor`` along their height, so their BatchNorm and neurons hold 1/tensor of the activations
# (reduce-scatter + all-gather in place of the all-reduce, plus halo exchanges for the next conv).
SEQUENCE_RULES: dict[str, str] = {"height": "tensor"}


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One parallelism strategy; see the module docstring."""

    name: str
    description: str
    rules: Mapping[str, str | tuple[str, ...]]
    fsdp: bool = False
    zero_stage: int = 0
    requires: tuple[str, ...] = ()  # mesh axes that must be > 1
    allows: tuple[str, ...] = ()  # mesh axes that may be > 1 (a superset of requires)
    sequence_parallel: bool = False

    @property
    def tensor(self) -> bool:
        return "tensor" in self.allows

    def with_sequence_parallel(self, on: bool) -> Strategy:
        """This strategy with the sequence-parallel activation rules added (needs tensor parallelism)."""
        if not on or self.sequence_parallel:
            return self
        if not self.tensor:
            raise ValueError(f"sequence_parallel splits activations over the tensor axis, which mode {self.name!r} "
                             "does not use; choose a tensor-parallel mode (tp, fsdp_tp, dp_tp, hybrid)")
        return dataclasses.replace(self, rules={**self.rules, **SEQUENCE_RULES}, sequence_parallel=True)

    def with_zero(self, stage: int | None) -> Strategy:
        """This strategy with ZeRO ``stage`` (0/1/2) over ``data``; None keeps it."""
        if stage is None or stage == self.zero_stage:
            return self
        if stage not in (0, 1, 2):
            raise ValueError(f"zero_stage must be 0, 1 or 2, got {stage!r} (stage 3 is mode 'fsdp')")
        if stage and "data" not in self.allows:
            raise ValueError(f"zero_stage={stage} shards over the data axis, which mode {self.name!r} does not "
                             "use; choose a mode with data parallelism (dp, dp_tp, fsdp, fsdp_tp, hybrid)")
        return dataclasses.replace(self, zero_stage=stage)


_TP = {**BATCH_RULES, **TP_RULES}
STRATEGIES: dict[str, Strategy] = {s.name: s for s in [
    Strategy("none", "one device", BATCH_RULES),
    Strategy("dp", "data parallel: batch on data, parameters replicated, gradients all-reduced", BATCH_RULES,
             allows=("data",)),
    Strategy("zero1", "data parallel + ZeRO-1: optimizer state sharded over data", BATCH_RULES, zero_stage=1,
             requires=("data",), allows=("data",)),
    Strategy("zero2", "data parallel + ZeRO-2: optimizer state and gradients sharded over data", BATCH_RULES,
             zero_stage=2, requires=("data",), allows=("data",)),
    Strategy("fsdp", "FSDP (ZeRO-3): parameters, gradients, optimizer state sharded over fsdp; batch over "
             "data x fsdp (data > 1: hybrid sharding, replicas over data)", BATCH_RULES, fsdp=True,
             requires=("fsdp",), allows=("data", "fsdp")),
    Strategy("tp", "tensor parallel: column/row-parallel pairs over tensor", _TP, requires=("tensor",),
             allows=("tensor",)),
    Strategy("fsdp_tp", "FSDP over fsdp (and data replicas) x tensor parallel over tensor", _TP, fsdp=True,
             requires=("fsdp", "tensor"), allows=("data", "fsdp", "tensor")),
    Strategy("dp_tp", "data parallel over data x tensor parallel over tensor", _TP, requires=("data", "tensor"),
             allows=("data", "tensor")),
    Strategy("hybrid", "every axis the mesh gives: batch over data x fsdp, parameters over fsdp, tensor "
             "parallel over tensor (any data x fsdp x tensor, each may be 1)", _TP, fsdp=True,
             allows=("data", "fsdp", "tensor")),
]}
MODES = tuple(STRATEGIES)


def both(config: str, python: str) -> str:
    """A setting as both callers spell it in an error: train.py's ``--config.`` key (``config``, e.g.
    ``"parallel.mode=pp"``) and the Python argument of ``snnjax.trainer`` / ``snnjax.parallel.plan`` (``python``,
    e.g. ``"mode='pp'"``)."""
    return f"--config.{config} ({python} in Python)"


def get_strategy(mode: str, zero_stage: int | None = None, sequence_parallel: bool = False) -> Strategy:
    if mode not in STRATEGIES:
        raise ValueError(f"parallel mode {mode!r} is not known; choose one of {list(MODES) + ['pp', 'auto']}")
    return STRATEGIES[mode].with_zero(zero_stage).with_sequence_parallel(sequence_parallel)


def check_mesh(strategy: Strategy, axis_sizes: Mapping[str, int]) -> None:
    """Raise ``ValueError`` saying what to change when the mesh does not fit the strategy."""
    if axis_sizes.get("stage", 1) > 1:
        pp, data = both("parallel.mode=pp", "mode='pp'"), both("parallel.mesh=data=-1", "the layout 'data=-1'")
        raise ValueError(f"the mesh has stage={axis_sizes['stage']}, which only the pipeline mode uses; set {pp}, "
                         f"or stage=1 (e.g. {data})")
    for axis in strategy.requires:
        if axis_sizes.get(axis, 1) < 2:
            raise ValueError(f"mode {strategy.name!r} needs the mesh axis {axis!r} > 1, but it is "
                             f"{axis_sizes.get(axis, 1)} in mesh {dict(axis_sizes)}; give it size > 1 (e.g. "
                             f"{both(f'parallel.mesh={_example(strategy)}', f'the layout {_example(strategy)!r}')}) "
                             f"or choose another mode ({both('parallel.mode', 'mode=')})")
    for axis in ("data", "fsdp", "tensor"):
        if axis_sizes.get(axis, 1) > 1 and axis not in strategy.allows:
            used = ", ".join(strategy.allows) or "no axis (one device)"
            modes = ", ".join(m for m, s in STRATEGIES.items() if axis in s.allows)
            raise ValueError(f"mode {strategy.name!r} uses {used}, but the mesh has {axis}={axis_sizes[axis]} "
                             f"(mesh {dict(axis_sizes)}), which would only replicate work; set {axis}=1 or choose a "
                             f"mode that uses {axis!r} ({modes}): the mesh is {both('parallel.mesh', 'the layout')}, "
                             f"the mode {both('parallel.mode', 'mode=')}")


def _example(strategy: Strategy) -> str:
    if len(strategy.requires) == 1:
        return f"{strategy.requires[0]}=-1"
    return ",".join(f"{a}={2 if a == 'tensor' else -1}" for a in strategy.requires)


def spec_shards(spec: PartitionSpec, axis_sizes: Mapping[str, int], ndim: int) -> list[int]:
    """How many shards each of ``ndim`` dims is split into under ``spec``."""
    out = []
    for i in range(ndim):
        entry = spec[i] if i < len(spec) else None
        axes = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
        out.append(math.prod(axis_sizes[a] for a in axes))
    return out


def spec_axes(spec: PartitionSpec) -> set[str]:
    used = set()
    for entry in spec:
        if entry is not None:
            used.update((entry,) if isinstance(entry, str) else entry)
    return used


def add_axis(spec: PartitionSpec, shape: Sequence[int], axis: str, axis_sizes: Mapping[str, int]) -> PartitionSpec:
    """``spec`` with ``axis`` added to the dim with the largest per-device extent it divides (else unchanged)."""
    size = axis_sizes.get(axis, 1)
    if size < 2 or axis in spec_axes(spec):
        return spec
    shards = spec_shards(spec, axis_sizes, len(shape))
    best, best_key = None, None
    for d, n in enumerate(shape):
        if n % (shards[d] * size):
            continue
        key = (n // shards[d], shards[d] == 1, -d)  # largest local extent, then an unsharded dim, then the first
        if best_key is None or key > best_key:
            best, best_key = d, key
    if best is None:
        return spec
    entries = [spec[i] if i < len(spec) else None for i in range(len(shape))]
    old = entries[best]
    entries[best] = axis if old is None else ((old,) if isinstance(old, str) else tuple(old)) + (axis,)
    return PartitionSpec(*entries)


@dataclasses.dataclass(frozen=True)
class ArrayLayout:
    """Where one parameter lives: stored (``param``), as used in the forward (``compute``), its
    gradient before the update (``grad``) and its optimizer state (``opt``)."""

    param: PartitionSpec
    compute: PartitionSpec
    grad: PartitionSpec
    opt: PartitionSpec
    notes: tuple[str, ...] = ()


def logical_spec(names: Sequence[str | None] | None, shape: Sequence[int], rules: Mapping,
                 axis_sizes: Mapping[str, int]) -> tuple[PartitionSpec, tuple[str, ...]]:
    """The rule table applied to ``names`` (divisibility fallback: replicated), and notes on fallbacks."""
    if names is None:
        return PartitionSpec(*([None] * len(shape))), ()
    used: set[str] = set()
    entries, notes = [], []
    for name, n in zip(names, shape, strict=True):
        axes = rules.get(name) if name is not None else None
        axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
        axes = tuple(a for a in axes if axis_sizes.get(a, 1) > 1)
        if not axes:
            entries.append(None)
            continue
        k = math.prod(axis_sizes[a] for a in axes)
        if n % k or used & set(axes):
            why = f"{n} does not divide by {'x'.join(axes)}={k}" if n % k else f"{axes} already used"
            notes.append(f"{name!r} kept whole ({why})")
            entries.append(None)
            continue
        used.update(axes)
        entries.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries), tuple(notes)


def array_layout(names, shape: Sequence[int], strategy: Strategy, axis_sizes: Mapping[str, int], *,
                 min_shard_size: int = 0) -> ArrayLayout:
    """The layout of one parameter under ``strategy`` on a mesh of ``axis_sizes``."""
    compute, notes = logical_spec(names, shape, strategy.rules, axis_sizes)
    big = math.prod(shape) >= max(min_shard_size, 1) and len(shape) > 0
    param = add_axis(compute, shape, "fsdp", axis_sizes) if strategy.fsdp and big else compute
    if strategy.fsdp and big and param == compute and axis_sizes.get("fsdp", 1) > 1:
        notes += (f"no dim divides by fsdp={axis_sizes['fsdp']}: replicated over fsdp",)
    opt = add_axis(param, shape, "data", axis_sizes) if strategy.zero_stage >= 1 and big else param
    grad = opt if strategy.zero_stage >= 2 else param
    return ArrayLayout(param=param, compute=compute, grad=grad, opt=opt, notes=notes)


def state_spec(names, shape: Sequence[int], strategy: Strategy, axis_sizes: Mapping[str, int]) -> PartitionSpec:
    """Non-parameter model state (BatchNorm statistics, neuron state): follows its channels (tensor rules only)."""
    return logical_spec(names, shape, strategy.rules, axis_sizes)[0]
