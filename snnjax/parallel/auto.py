"""Choosing a layout: the mode a mesh implies, the mesh a mode gets by default, and ``mode="auto"``'s policy."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import jax

from snnjax.parallel import rules as rules_lib
from snnjax.parallel.mesh import AXES

OBJECTIVES = ("speed", "memory")
BN_NOTE = ("; BatchNorm then normalises each microbatch with its own statistics (as gradient accumulation does), "
           "not the whole batch's")


def infer_mode(axis_sizes: Mapping[str, int]) -> str:
    """The named mode that uses exactly the mesh's axes of size > 1."""
    used = {a for a in ("data", "fsdp", "tensor") if axis_sizes.get(a, 1) > 1}
    return {frozenset(): "none", frozenset({"data"}): "dp", frozenset({"fsdp"}): "fsdp",
            frozenset({"data", "fsdp"}): "fsdp", frozenset({"tensor"}): "tp",
            frozenset({"fsdp", "tensor"}): "fsdp_tp", frozenset({"data", "fsdp", "tensor"}): "hybrid",
            frozenset({"data", "tensor"}): "dp_tp"}[frozenset(used)]


def default_axis_sizes(mode: str | None, n: int) -> dict[str, int]:
    """The mesh axis sizes mode ``mode`` gets on ``n`` devices (``None``: data parallelism)."""
    if n < 1:
        raise ValueError(f"device count must be >= 1, got {n}")
    sizes = dict.fromkeys(AXES, 1)
    if mode == "none":
        return sizes
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
    else:
        rules_lib.get_strategy(mode)  # raises for unknown modes
    return sizes


def device_memory_bytes() -> int | None:
    """The first device's memory limit in bytes, where the backend reports one (not the CPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def choose(n: int, total_bytes: int, opt_slots: int, has_tp: bool, objective: str, budget: int | None,
           global_batch_size: int | None,
           pipeline_bytes: Callable[[int], int | None] | None = None) -> tuple[str, dict[str, int], list[str]]:
    """``mode="auto"``: pick mode and mesh for ``n`` devices; returns ``(mode, axis_sizes, reasons)``.

    ``total_bytes``: the parameters' bytes; ``budget``: device memory in bytes (None: unknown).
    ``pipeline_bytes(S)``: the parameter, gradient and optimizer bytes per device of a pipeline over ``S``
    stages (None where the model cannot be pipelined that way); without it ``pp`` is never chosen.
    A pipeline is chosen where nothing else uses every device (the batch does not split over them and the
    model has no tensor-parallel layers), and, for speed, where ZeRO-2 does not fit but a pipeline does.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    sizes = dict.fromkeys(AXES, 1)
    if n == 1:
        return "none", sizes, ["one device: nothing to split"]
    reasons = []
    batch_shards = math.gcd(n, global_batch_size) if global_batch_size else n
    tensor = n // batch_shards
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    if tensor > 1 and not has_tp:
        per_device = pipeline_bytes(tensor) if pipeline_bytes is not None else None
        if per_device is not None:
            sizes.update(data=batch_shards, stage=tensor)
            reasons.append(f"the global batch of {global_batch_size} splits over {batch_shards} of {n} devices and "
                           f"the model has no tensor-parallel layers: the other factor {tensor} pipelines the "
                           f"model's units over stage ({mib(per_device)} of parameters, gradients and "
                           f"optimizer state per device){BN_NOTE}")
            return "pp", sizes, reasons
        raise ValueError(f"the global batch of {global_batch_size} splits over only {batch_shards} of {n} "
                         "devices and the model has neither tensor-parallel layers nor enough units to pipeline "
                         f"over {tensor} stages; use a batch size that is a multiple of {n}")
    if tensor > 1:
        reasons.append(f"the global batch of {global_batch_size} splits over {batch_shards} devices; the other "
                       f"factor {tensor} goes to tensor parallelism")
    replicated = total_bytes * (2 + opt_slots)  # parameters, gradients, optimizer slots
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
    sharded2 = total_bytes + (total_bytes + opt_slots * total_bytes) / batch_shards
    if sharded2 <= limit and tensor == 1:
        sizes.update(data=batch_shards)
        reasons.append(f"objective=speed: replicated state ({mib(replicated)}) exceeds half the device memory; "
                       f"ZeRO-2 keeps parameters whole but shards gradients and optimizer state ({mib(sharded2)})")
        return "zero2", sizes, reasons
    for stages in (s for s in range(2, n + 1) if n % s == 0) if tensor == 1 and pipeline_bytes else ():
        per_device = pipeline_bytes(stages)
        if per_device is not None and per_device <= limit:
            sizes.update(data=n // stages, stage=stages)
            reasons.append(f"objective=speed: even ZeRO-2 ({mib(sharded2)}) exceeds half the device memory; a "
                           f"pipeline over stage={stages} keeps {mib(per_device)} of parameters, gradients and "
                           "optimizer state per device, and moves only stage-boundary activations"
                           f"{f' and a gradient all-reduce over data={n // stages}' if n > stages else ''}, where "
                           f"FSDP would gather every parameter each step{BN_NOTE}")
            return "pp", sizes, reasons
    sizes.update(fsdp=batch_shards, tensor=tensor)
    reasons.append(f"objective=speed: even ZeRO-2 ({mib(sharded2)}) exceeds half the device memory"
                   f"{' and no pipeline fits' if pipeline_bytes and tensor == 1 else ''}; FSDP shards the "
                   "parameters too")
    return ("fsdp" if tensor == 1 else "fsdp_tp"), sizes, reasons
