"""``analyze(model)``: what a parallel plan works with (neurons, parameters, tensor-parallel layers)."""
from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx

from snnjax.neurons.modules import BaseNode
from snnjax.parallel.logical import logical_axes
from snnjax.parallel.variables import flat_vars, value


def tp_role(names) -> str | None:
    """``column`` / ``row`` for a kernel tensor parallelism splits, else None.

    Kernels are ``[*in, *out]``; a row-parallel layer's output dim is whole (``embed`` / ``classes``).
    """
    if not names or not {"mlp", "heads"} & set(names) or len(names) < 2:
        return None
    return "row" if names[-1] in ("embed", "classes") else "column"


def analyze(model: nnx.Module) -> dict[str, Any]:
    """What a parallel plan works with: ``neurons``, ``parameters`` (path, shape, dtype, logical names),
    ``tp_layers`` (layers tensor parallelism splits: column- or row-parallel, kernel shape) and
    ``unannotated`` parameters (no logical names: never tensor-split)."""
    neurons = []
    for path, module in nnx.iter_modules(model):
        if isinstance(module, BaseNode):
            neurons.append({"path": ".".join(map(str, path)), "kind": module.kind or type(module).__name__,
                            "step_mode": module.step_mode, "v_threshold": module.v_threshold,
                            "v_reset": module.v_reset, "surrogate": type(module.surrogate_function).__name__})
    params = []
    for path, var in flat_vars(nnx.state(model, nnx.Param)):
        val = value(var)
        params.append({"path": path, "shape": tuple(np.shape(val)), "dtype": str(np.dtype(val.dtype)),
                       "size": int(np.size(val)), "logical_axes": logical_axes(var)})
    tp_layers = [{"layer": p["path"].rsplit(".", 1)[0], "role": tp_role(p["logical_axes"]),
                  "kernel_shape": p["shape"], "logical_axes": p["logical_axes"]}
                 for p in params if p["path"].endswith("kernel") and tp_role(p["logical_axes"])]
    unannotated = [p["path"] for p in params if p["logical_axes"] is None and p["shape"]]
    return {"model": type(model).__name__, "num_params": sum(p["size"] for p in params),
            "param_bytes": sum(p["size"] * np.dtype(p["dtype"]).itemsize for p in params),
            "neurons": neurons, "parameters": params, "tp_layers": tp_layers, "unannotated": unannotated}
