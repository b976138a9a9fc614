"""Export a trained run for inference without its code: ``python -m snnjax.export --workdir RUN --out model.bin``.

Serialises the eval-mode forward with ``jax.export`` (StableHLO), the batch size symbolic, in
two variants: the multi-step forward ``x [T, b, ...] -> logits [T, b, K]`` and the streaming
single step ``(states, x [b, ...]) -> (logits [b, K], states)``: the model's own layers with its neurons in
single-step mode (``snnjax.deploy.streaming.step``; absent, with the reason in ``meta.json``'s
``single_step_note``, for a model streaming refuses). The parameters travel in the file as the functions' first
argument. Neurons run their portable ``xla`` implementation (no custom kernels in the file).
``snnjax.deploy.exported.load_exported`` runs the file; that module (the format's description) imports only
jax and numpy, so it can be copied beside a deployment that lacks snnjax.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.deploy.calls import UnsupportedModelError
from snnjax.deploy.exported import FORMAT, sha256
from snnjax.deploy.run import load_run
from snnjax.deploy.streaming import initial_states, step
from snnjax.layers.conv_cpu import sparse_inputs
from snnjax.neurons.modules import set_impl
from snnjax.train import config as config_lib

PLATFORMS = ("cpu", "cuda")


def export_model(model: nnx.Module, frame_shape: Sequence[int], time_steps: int, dtype, out: str, *,
                 platforms: Sequence[str] = PLATFORMS, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``model`` (eval mode) to ``out``; returns the file's ``meta.json``.

    ``frame_shape``: one example at one time step (``(H, W, C)`` or ``(F,)``); ``time_steps``: the ``T`` of the
    multi-step variant; ``dtype``: the input dtype; ``platforms``: those the StableHLO is lowered for.
    """
    model.eval()
    set_impl(model, "xla")  # custom kernels (C++ FFI, Pallas) would tie the file to this build
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    # RNG keys (dropout's stream, unused at inference) travel as their raw data and are wrapped again inside.
    key_impls = {i: jax.random.key_impl(x) for i, x in enumerate(leaves)
                 if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)}
    leaves = [jax.random.key_data(x) if i in key_impls else x for i, x in enumerate(leaves)]

    def rebuild(params):
        params = [jax.random.wrap_key_data(x, impl=key_impls[i]) if i in key_impls else x
                  for i, x in enumerate(params)]
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, params))

    dtype = jnp.dtype(dtype)
    frame = tuple(int(d) for d in frame_shape)
    (b,) = jax.export.symbolic_shape("b")
    param_specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]

    def multi(params, x):
        return rebuild(params)(x)

    with sparse_inputs(False):  # no FFI convolution either
        exported_multi = jax.export.export(jax.jit(multi), platforms=tuple(platforms))(
            param_specs, jax.ShapeDtypeStruct((time_steps, b, *frame), dtype))
    meta: dict[str, Any] = {"format": FORMAT, "frame_shape": list(frame), "time_steps": int(time_steps),
                            "dtype": dtype.name, "platforms": list(platforms), **(info or {})}
    files = {"multi_step.jax": exported_multi.serialize()}
    try:
        states = initial_states(model, jax.ShapeDtypeStruct((1, *frame), dtype))
    except UnsupportedModelError as e:
        meta["states"], meta["single_step_note"] = [], str(e)
    else:
        meta["states"] = [{"shape": list(s.shape[1:]), "dtype": s.dtype.name, "init": float(s.reshape(-1)[0])}
                          for s in states]

        def single(params, states, x):
            return step(rebuild(params), x, states)

        state_specs = [jax.ShapeDtypeStruct((b, *s.shape[1:]), s.dtype) for s in states]
        with sparse_inputs(False):
            files["single_step.jax"] = jax.export.export(jax.jit(single), platforms=tuple(platforms))(
                param_specs, state_specs, jax.ShapeDtypeStruct((b, *frame), dtype)).serialize()
    buffer = io.BytesIO()
    np.savez(buffer, **{f"p{i}": np.asarray(x) for i, x in enumerate(leaves)})
    files["params.npz"] = buffer.getvalue()
    meta["sha256"] = {name: sha256(bytes(data)) for name, data in files.items()}
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("meta.json", json.dumps(meta, indent=2))
        for name, data in files.items():
            z.writestr(name, bytes(data))
    return meta


def export_run(workdir: str, out: str, *, checkpoint: int | None = None,
               platforms: Sequence[str] = PLATFORMS) -> dict[str, Any]:
    """Export the model of the run in ``workdir`` (checkpoint ``checkpoint``, default the latest) to ``out``."""
    run = load_run(workdir, checkpoint)
    source = run.source("test")
    shape = tuple(source.example_shape)
    frame = shape[1:] if run.time_major else shape
    time_steps = shape[0] if run.time_major else run.config.data.time_steps
    info = {"run": str(workdir), "step": run.step, "model": run.config.model.name, "data": run.config.data.name,
            "num_classes": int(source.num_classes),
            "encoder": None if run.time_major else run.config.data.encoder}
    return export_model(run.model, frame, time_steps, run.step_config.compute_dtype, out, platforms=platforms,
                        info=info)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m snnjax.export", description=__doc__.split("\n")[0])
    p.add_argument("--workdir", required=True, help="the training run's directory (config.json, checkpoints/)")
    p.add_argument("--checkpoint", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--out", required=True, help="the file to write (a zip archive, see snnjax.deploy.export)")
    p.add_argument("--platforms", default=",".join(PLATFORMS), help="lower for these jax platforms (comma-separated)")
    args = p.parse_args(argv)
    try:
        if config_lib.load(args.workdir).dtype == "float64":
            jax.config.update("jax_enable_x64", True)
        meta = export_run(args.workdir, args.out, checkpoint=args.checkpoint,
                          platforms=[s.strip() for s in args.platforms.split(",") if s.strip()])
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    variants = "multi-step and single-step" if meta["states"] else "multi-step"
    print(f"{meta['model']} (checkpoint {meta['step']}) -> {args.out}: {variants}, input "
          f"[T={meta['time_steps']}, b, {', '.join(map(str, meta['frame_shape']))}] {meta['dtype']}, "
          f"platforms {', '.join(meta['platforms'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
