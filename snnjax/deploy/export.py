"""Export a trained run for inference, and run the exported file without the model's code.

``python -m snnjax.export --workdir RUN --out model.bin`` writes it (``export_run`` / ``export_model``);
``load_exported`` runs it (no model code needed: the functions are StableHLO):

    model = load_exported("model.bin")
    logits = model(x)                       # x [T, N, ...] -> [T, N, K], any N
    states = model.init_states(n)           # streaming: one time step at a time
    logits_t, states = model.step(x[t], states)

The file is a zip archive:

- ``meta.json``: format version, input shape per example and time step, ``time_steps``, dtype,
  the neuron states of the single step (shape without the batch, initial value), the run it came from;
- ``multi_step.jax``: ``jax.export`` serialisation (StableHLO) of ``(params, x [T, b, ...]) -> logits [T, b, K]``;
- ``single_step.jax``: of ``(params, states, x [b, ...]) -> (logits [b, K], states)``, the model's own layers
  with its neurons in single-step mode (``snnjax.deploy.streaming.step``; absent, with the reason in
  ``meta.json``'s ``single_step_note``, for a model streaming refuses);
- ``params.npz``: the parameters and BatchNorm statistics, the functions' first argument (a list, in order).

The batch size ``b`` is symbolic: one file serves every batch size. Neurons run their portable ``xla``
implementation (no custom kernels in the file).
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import json
import pathlib
import sys
import zipfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from flax import nnx

# The reader (ExportedModel, load_exported) needs only jax and numpy: a deployment copies this file alone (the
# writer imports snnjax and flax inside its functions).
FORMAT = "snnjax-export-1"


@dataclasses.dataclass
class ExportedModel:
    """An exported model: ``__call__`` runs the multi-step forward, ``step`` one time step (see the module docstring).

    Attributes:
      meta: ``meta.json``. params: the parameter arrays passed to the functions.
    """

    meta: dict[str, Any]
    params: list[jax.Array]
    multi_step: jax.export.Exported
    single_step: jax.export.Exported | None

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [T, N, ...]`` -> logits ``[T, N, K]``."""
        return self.multi_step.call(self.params, jnp.asarray(x, self.meta["dtype"]))

    def init_states(self, batch_size: int) -> list[jax.Array]:
        """Fresh neuron states for ``batch_size`` streams."""
        self._need_step()
        return [jnp.full((batch_size, *s["shape"]), s["init"], s["dtype"]) for s in self.meta["states"]]

    def step(self, x: jax.Array, states: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        """One time step ``x [N, ...]`` from ``states``: ``(logits [N, K], new states)``."""
        self._need_step()
        logits, states = self.single_step.call(self.params, states, jnp.asarray(x, self.meta["dtype"]))
        return logits, list(states)

    def _need_step(self) -> None:
        if self.single_step is None:
            raise ValueError(f"this file has no single-step variant: {self.meta.get('single_step_note')}")


def load_exported(path: str | pathlib.Path) -> ExportedModel:
    """Read a file written by ``snnjax.export``.

    Raises:
      ValueError: not such a file, or a format version this loader does not read.
    """
    try:
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read("meta.json"))
            multi = z.read("multi_step.jax")
            single = z.read("single_step.jax") if "single_step.jax" in z.namelist() else None
            arrays = np.load(io.BytesIO(z.read("params.npz")))
            params = [jnp.asarray(arrays[f"p{i}"]) for i in range(len(arrays.files))]
    except (zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"{path} is not a model written by python -m snnjax.export ({e})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} has format {meta.get('format')!r}; this loader reads {FORMAT!r}")
    if meta["dtype"] == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(f"{path} was exported in float64: call jax.config.update('jax_enable_x64', True) first")
    return ExportedModel(meta, params, jax.export.deserialize(bytearray(multi)),
                         None if single is None else jax.export.deserialize(bytearray(single)))


PLATFORMS = ("cpu", "cuda")


def export_model(model: nnx.Module, frame_shape: Sequence[int], time_steps: int, dtype, out: str, *,
                 platforms: Sequence[str] = PLATFORMS, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``model`` (eval mode) to ``out``; returns the file's ``meta.json``.

    ``frame_shape``: one example at one time step (``(H, W, C)`` or ``(F,)``); ``time_steps``: the ``T`` of the
    multi-step variant; ``dtype``: the input dtype; ``platforms``: those the StableHLO is lowered for.
    """
    from flax import nnx  # noqa: PLC0415 (the writer's imports: see the comment above FORMAT)

    from snnjax.deploy.calls import UnsupportedModelError  # noqa: PLC0415
    from snnjax.deploy.streaming import initial_states, step  # noqa: PLC0415
    from snnjax.neurons.modules import set_impl  # noqa: PLC0415

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
        files["single_step.jax"] = jax.export.export(jax.jit(single), platforms=tuple(platforms))(
            param_specs, state_specs, jax.ShapeDtypeStruct((b, *frame), dtype)).serialize()
    buffer = io.BytesIO()
    np.savez(buffer, **{f"p{i}": np.asarray(x) for i, x in enumerate(leaves)})
    files["params.npz"] = buffer.getvalue()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("meta.json", json.dumps(meta, indent=2))
        for name, data in files.items():
            z.writestr(name, bytes(data))
    return meta


def export_run(workdir: str, out: str, *, checkpoint: int | None = None,
               platforms: Sequence[str] = PLATFORMS) -> dict[str, Any]:
    """Export the model of the run in ``workdir`` (checkpoint ``checkpoint``, default the latest) to ``out``."""
    from snnjax.deploy.run import load_run  # noqa: PLC0415

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
    from snnjax.deploy.run import read_config  # noqa: PLC0415

    try:
        if read_config(args.workdir).dtype == "float64":
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
