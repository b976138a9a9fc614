"""``snnjax.trainer``: train any NNX model under any layout from Python, in a few lines.

    trainer = snnjax.trainer(model, "fsdp=4,tensor=2", optax.adam(1e-3))
    for batch in batches:                          # {"inputs": [T, N, H, W, C], "labels": [N]}
        metrics = trainer.step(batch)              # {"loss": ..., "accuracy": ..., "grad_norm": ...}
    trainer.evaluate(test_batches)                 # {"loss": ..., "accuracy": ...}
    trainer.save("ckpt"); trainer.restore("ckpt")
    model = trainer.model()                        # the trained nnx.Module
    model = snnjax.load_model(model, "ckpt")       # a checkpoint's weights into a model

The model is any ``nnx.Module`` mapping ``[T, N, ...]`` inputs to logits ``[T, N, classes]``
(a registry model, ``snnjax.models.Sequential`` or the user's own class; a pipeline,
``stage`` > 1, also needs its ``units()``, see ``snnjax.models.units``). The layout is a
mesh spec (``"stage=2,data=4"``) or a ``Mesh``; the mode follows from its axes unless
``mode`` is given (``snnjax.parallel.plan``). The batch's arrays are placed with
``trainer.batch_shardings`` (by name: ``inputs`` split over data x fsdp on its batch axis,
``labels`` likewise), so numpy batches can be passed as they are.

Checkpoints are the training program's own (``snnjax.train.checkpoint``): they hold the
parameter tree whatever the layout, so one saved under a pipeline restores under FSDP, and
``load_model`` reads one into a model without an optimizer.
"""
from __future__ import annotations

import contextlib
import functools
import pathlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from snnjax import parallel
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.parallel.variables import path_str
from snnjax.train import online, profiling
from snnjax.train.checkpoint import Checkpointer, CheckpointError, complete_steps
from snnjax.train.sharded import apply_plan, eval_fn
from snnjax.train.step import StepConfig, TrainState, split_model

COMPILE_NOTICE_SECONDS = 3.0  # a compile that takes longer says so on one line

Batch = Mapping[str, Any]


class ModelTrainer:
    """A model, its optimizer state and the jitted steps under one parallel plan (built by ``trainer``)."""

    def __init__(self, model: nnx.Module, plan: parallel.Plan, optimizer: optax.GradientTransformation,
                 step_config: StepConfig, *, donate: bool = True, verbose: bool = True):
        self.plan = plan
        self.mesh = plan.mesh
        self.optimizer = optimizer
        self.step_config = step_config
        self.verbose = verbose
        self._time_major = step_config.encoder is None
        graphdef, params, rngs, rest = split_model(model)
        params, rest = jax.device_put((params, rest), may_alias=False)  # steps reuse buffers: `model` stays usable
        self._graphdef = graphdef
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                           opt_state=optimizer.init(params))
        self.state, self._train_step = apply_plan(plan, state, step_config, graphdef, optimizer, donate=donate)
        tree_like = self.state.params if plan.packing is None else plan.packing.abstract_tree()
        self._eval_step = eval_fn(plan, self.state.replace(params=tree_like), step_config, graphdef)
        self._compiled = None
        self._checked_shape = None
        self.profile: dict[str, Any] | None = None  # the last profiled steps' trace and time split (fit, Trainer)

    # -- batches -----------------------------------------------------------------------------

    def batch_sharding(self, name: str, ndim: int) -> NamedSharding:
        """The sharding of batch entry ``name`` with ``ndim`` dims: its batch axis over data x fsdp (``inputs``
        are ``[T, N, ...]``, batch axis 1, unless an encoder makes them ``[N, ...]``; everything else axis 0)."""
        axis = 1 if (name == "inputs" and self._time_major) else 0
        return mesh_lib.batch_sharding(self.mesh, ndim, axis)

    @property
    def batch_shardings(self) -> dict[str, NamedSharding]:
        """``{"inputs": ..., "labels": ...}`` for batches of ``[T, N, ...]`` images (5-D) and ``[N]`` labels."""
        return {"inputs": self.batch_sharding("inputs", 5 if self._time_major else 4),
                "labels": self.batch_sharding("labels", 1)}

    def put(self, batch: Batch) -> dict[str, jax.Array]:
        """``batch`` (numpy or JAX arrays) placed on the mesh by name (``batch_sharding``), layout checked. Of
        several processes, each passes the rows its devices hold (``snnjax.data.Loader(batch_sharding=...)``)."""
        missing = {"inputs", "labels"} - set(batch)
        if missing:
            raise ValueError(f"a batch is a dict with 'inputs' and 'labels'; this one lacks {sorted(missing)} "
                             f"(it has {sorted(batch)})")
        self._check_layout(batch)
        if jax.process_count() > 1:
            return {k: jax.make_array_from_process_local_data(self.batch_sharding(k, np.ndim(v)), v)
                    for k, v in batch.items()}
        return {k: jax.device_put(v, self.batch_sharding(k, np.ndim(v))) for k, v in batch.items()}

    def _check_layout(self, batch: Batch) -> None:
        """Refuse inputs whose batch axis does not hold the labels' examples, naming the layout expected."""
        shape, labels = tuple(np.shape(batch["inputs"])), tuple(np.shape(batch["labels"]))
        if (shape, labels) == self._checked_shape:
            return
        axis = 1 if self._time_major else 0
        expected = "[T, N, H, W, C] (time-major, channels-last)" if self._time_major else "[N, ...]"
        if len(labels) != 1 or len(shape) <= axis or shape[axis] != labels[0]:
            hint = ""
            if self._time_major and len(shape) >= 2 and labels and shape[0] == labels[0]:
                hint = (" They look batch-first ([N, T, ...]): pass inputs.swapaxes(0, 1)"
                        + ("; SpikingJelly's [N, T, C, H, W] is x.transpose(1, 0, 3, 4, 2)" if len(shape) == 5
                           else "") + ".")
            raise ValueError(f"inputs of shape {shape} with labels of shape {labels}: the model takes inputs "
                             f"{expected} with the N examples of labels [N] on axis {axis}.{hint}")
        n, shards = labels[0], self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if n % shards and jax.process_count() == 1:  # of several processes, n is this process's rows
            raise ValueError(f"a batch of {n} examples does not split over data x fsdp = {shards} devices; use a "
                             f"multiple of {shards} examples (evaluate() pads a last partial batch itself)")
        self._checked_shape = (shape, labels)

    # -- training ----------------------------------------------------------------------------

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on ``batch`` (``inputs`` ``[T, N, ...]``, integer ``labels`` ``[N]``); returns
        ``loss``, ``accuracy`` and ``grad_norm`` as floats (reading them waits for the step)."""
        metrics = self.advance(self.put(batch))
        return {k: float(v) for k, v in jax.device_get(metrics).items() if k in ("loss", "accuracy", "grad_norm")}

    def compile(self, placed: Mapping[str, jax.Array]):
        """The train step compiled for batches shaped as ``placed`` (a ``put`` batch); kept for later steps."""
        if self._compiled is None or self._compiled[0] != _signature(placed):
            with compile_notice("the train step", self.verbose):
                self._compiled = (_signature(placed), self._train_step.lower(self.state, placed).compile())
        return self._compiled[1]

    def advance(self, placed: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """One optimizer step on a ``put`` batch, without waiting for it: the step's metrics as device arrays
        (``loss``, ``accuracy``, ``grad_norm``, and ``finite``: whether loss and gradient norm were finite)."""
        self.state, metrics = self.compile(placed)(self.state, placed)
        return metrics

    def fit(self, batches: Iterable[Batch], steps: int | None = None, *, progress: bool = True,
            profile_steps: int | tuple[int, int] | None = None,
            profile_dir: str | pathlib.Path = "profile") -> list[dict]:
        """``step`` on each batch (at most ``steps``), with a progress bar (``tqdm.auto``); the metrics of each step.

        ``profile_steps``: ``(first, last)`` (or one step) of the trainer's step count, 1-based, to trace with
        ``jax.profiler`` into ``profile_dir`` (``snnjax.train.profiling``); the trace's file and its time split
        by op kind are then in ``trainer.profile`` and printed.
        """
        from tqdm.auto import tqdm  # noqa: PLC0415 (tqdm.auto picks the notebook widget; only fit needs it)

        profiler = profiling.StepProfiler(profiling.parse_steps(profile_steps), profile_dir)
        history = []
        total = steps if steps is not None else (len(batches) if hasattr(batches, "__len__") else None)
        bar = tqdm(total=total, disable=not progress, unit="step")
        try:
            with bar:
                for i, batch in enumerate(batches):
                    if steps is not None and i >= steps:
                        break
                    number = self.step_count + 1
                    profiler.before(number)
                    history.append(self.step(batch))
                    if profiler.after(number, None):
                        self.record_profile(profiler.trace, print_with=bar.write)
                    bar.set_postfix(loss=f"{history[-1]['loss']:.4f}", acc=f"{history[-1]['accuracy']:.3f}")
                    bar.update(1)
        finally:
            profiler.close()
        return history

    def record_profile(self, trace: pathlib.Path | None, print_with=print) -> dict[str, Any] | None:
        """Keep the trace's path and time split in ``self.profile`` (and print the split)."""
        if trace is None or self._compiled is None:
            return None
        split = profiling.time_split(trace, self._compiled[1].as_text())
        self.profile = {"trace": str(trace), "split": split}
        if self.verbose:
            print_with(f"profile: {trace} ({profiling.format_split(split)})")
        return self.profile

    def evaluate(self, batches: Iterable[Batch]) -> dict[str, float]:
        """Mean ``loss`` and ``accuracy`` over every example of ``batches`` in eval mode (BatchNorm's running
        statistics); a batch that does not split over data x fsdp is padded and the padding masked out (as are
        the examples a batch's own ``mask``, ``[N]``, marks False)."""
        totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
        state = self._eval_state()
        # Of several processes, each passes its rows of a whole global batch (snnjax.data.Loader pads the last one).
        shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"] if jax.process_count() == 1 else 1
        for i, batch in enumerate(batches):
            padded = _pad_batch(batch, shards, 1 if self._time_major else 0)
            out = self._eval_step(state, self.put(padded), jnp.asarray(i))
            for k, v in jax.device_get(out).items():
                totals[k] += float(v)
        if not totals["count"]:
            raise ValueError("evaluate(batches) got no batch")
        return {"loss": totals["loss"] / totals["count"], "accuracy": totals["correct"] / totals["count"]}

    # -- inspecting ----------------------------------------------------------------------------

    def placements(self) -> str:
        """Where the parameters live: each one's shape and PartitionSpec, or under a pipeline each stage device's
        row of packed parameters by name."""
        if self.plan.packing is not None:
            return parallel.describe_stage_rows(self.plan.packing)
        return parallel.describe_shardings(self.state.params, title="parameters as placed:")

    def cost(self) -> dict[str, Any]:
        """The compiled train step's per-device memory and collectives (``snnjax.parallel.step_report``); after
        the first ``step``."""
        if self._compiled is None:
            raise ValueError("the train step's cost is read from its compiled program: call step(batch) once first")
        return parallel.step_report(self._compiled[1], self.state)

    def report(self, title: str | None = None) -> str:
        """``cost()`` as a table (``snnjax.parallel.format_report``)."""
        return parallel.format_report(self.cost(), *([] if title is None else [title]))

    # -- the model and checkpoints -----------------------------------------------------------

    def tree_state(self) -> TrainState:
        """The state with the parameter tree (a pipeline stores each device's stages packed): what checkpoints
        hold, so they restore into any layout."""
        return self.state if self.plan.packing is None else self._unpack_state(self.state)

    def set_tree_state(self, tree_state: TrainState) -> None:
        """Continue from ``tree_state`` (``tree_state()``'s form, e.g. a restored checkpoint), placed as the plan
        stores the state."""
        shardings = jax.tree.map(lambda x: x.sharding, self.state)
        if self.plan.packing is not None:
            self.state = jax.jit(self.plan.packing.pack_state, out_shardings=shardings)(tree_state)
        else:
            self.state = jax.device_put(tree_state, shardings)

    @functools.cached_property
    def _unpack_state(self):  # jitted once
        return jax.jit(self.plan.packing.unpack_state)

    @functools.cached_property
    def _gather_params(self):  # jitted once: the pipeline's rows -> the tree, as the eval step reads it
        packing = self.plan.packing
        return jax.jit(packing.unpack, out_shardings=self.plan.param_shardings(packing.abstract_tree(), "compute"))

    def _eval_state(self) -> TrainState:
        if self.plan.packing is None:
            return self.state
        return self.state.replace(params=self._gather_params(self.state.params), opt_state=())

    def model(self) -> nnx.Module:
        """The trained model as a new ``nnx.Module``: copies of the parameters and BatchNorm statistics, placed as
        the plan stores them (later steps, which reuse the trainer's buffers, do not change it)."""
        state = self.tree_state()
        params, model_state = jax.device_put((state.params, state.model_state), may_alias=False)
        return nnx.merge(self._graphdef, params, state.rngs, model_state)

    @property
    def step_count(self) -> int:
        """Optimizer steps taken."""
        return int(jax.device_get(self.state.step))

    def save(self, directory: str | pathlib.Path, *, overwrite: bool = False, keep: int = 3) -> pathlib.Path:
        """Save a checkpoint of the current step to ``directory`` (parameters, BatchNorm statistics, optimizer
        state); returns the step's folder. A ``directory`` that holds checkpoints is refused unless ``overwrite``
        (which deletes them first), so re-running a notebook cell cannot mix two runs' checkpoints."""
        directory = pathlib.Path(directory).absolute()
        existing = complete_steps(directory) if directory.exists() else []
        if existing and not overwrite:
            raise CheckpointError(f"{directory} already holds checkpoints of steps {existing}; pass overwrite=True to "
                                  "replace them, restore(directory) to continue from them, or save elsewhere")
        checkpointer = Checkpointer(directory, keep)
        try:
            for step in existing:
                checkpointer.manager.delete(step)
            checkpointer.save(self.tree_state(), {"mode": self.plan.mode, "mesh": dict(self.mesh.shape)})
        finally:
            checkpointer.close()
        return directory / str(self.step_count)

    def restore(self, directory: str | pathlib.Path, step: int | None = None) -> int:
        """Continue from the checkpoint of ``step`` (default: the latest) in ``directory``, saved under any
        layout; returns its step."""
        reader = Checkpointer(directory, read_only=True)
        try:
            tree_state, _ = reader.restore(self.tree_state(), step)
        finally:
            reader.close()
        self.set_tree_state(tree_state)
        return self.step_count

    def __repr__(self) -> str:
        sizes = " x ".join(f"{k}={v}" for k, v in self.plan.axis_sizes.items() if v > 1) or "1 device"
        return f"ModelTrainer(mode={self.plan.mode} on {sizes}, step={self.step_count})"


def trainer(model: nnx.Module, layout: str | Mesh = "data=-1", optimizer: optax.GradientTransformation | None = None,
            *, mode: str | None = None, devices: Sequence[jax.Device] | None = None,
            pipeline: PipelineOptions | None = None, example: Batch | None = None, loss: str = "ce",
            encoder: str | None = None, time_steps: int | None = None, dtype=jnp.float32, seed: int = 0,
            zero_stage: int | None = None, sequence_parallel: bool = False, donate: bool = True,
            verbose: bool = True, method: str = "bptt", online_updates: bool = False) -> ModelTrainer:
    """A ``ModelTrainer`` for ``model`` laid out on ``layout`` (see the module docstring).

    ``layout``: a mesh spec over the axes data / fsdp / tensor / stage / time (``"fsdp=4,tensor=2"``; one
    size may be -1) or a ``Mesh``; ``devices``: the devices the spec is laid over (default: all; pass
    ``jax.devices()[:4]`` for a mesh of 4). ``optimizer``: an optax transformation (default ``adam(1e-3)``).
    ``mode``: a mode of ``snnjax.parallel.MODES`` or ``"pp"`` (default: what the mesh's axes imply).
    ``pipeline``: ``snnjax.parallel.PipelineOptions`` (schedule, microbatches, ...) when ``stage`` > 1.
    ``example``: one batch (``{"inputs", "labels"}``): its size lets a pipeline choose its microbatches and
    its shape balance the stages; without it a pipeline needs ``pipeline=PipelineOptions(microbatches=M)``.
    ``encoder`` / ``time_steps``: for static inputs ``[N, ...]`` turned into ``[T, N, ...]`` by
    ``snnjax.data.encoders`` (``"direct"``, ``"poisson"``). ``dtype``: the compute dtype the inputs are cast
    to (``jnp.float64`` needs ``jax_enable_x64`` and a float64 model). ``loss``: ``"ce"`` or ``"tet"``.
    ``donate``: each step reuses its input buffers (the trainer's own copy: ``model`` is left as it was, untrained;
    ``trainer.model()`` gives the trained one).
    ``verbose``: one line when a compile takes more than a few seconds.
    ``method``: ``"bptt"``, or ``"ottt"`` / ``"sltt"``, online through time with memory constant in ``T``
    (``snnjax.train.online``; ``online_updates``: the optimizer steps at every time step).
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"trainer(model, ...): model must be an nnx.Module, got {type(model).__name__}")
    if (encoder is None) != (time_steps is None):
        raise ValueError("trainer(...): pass encoder= and time_steps= together (static inputs [N, ...] encoded into "
                         "T steps), or neither (inputs already [T, N, ...])")
    optimizer = optax.adam(1e-3) if optimizer is None else optimizer
    if isinstance(layout, Mesh):
        if devices is not None:
            raise ValueError("trainer(...): pass devices= with a layout string, not with a Mesh (it has its devices)")
        mesh = layout
    elif isinstance(layout, str):
        mesh = mesh_lib.make_mesh(layout, devices)
    else:
        raise TypeError(f"trainer(model, layout, ...): layout must be a mesh spec such as 'fsdp=4,tensor=2' or a "
                        f"Mesh, got {type(layout).__name__}")
    kwargs: dict[str, Any] = {}
    if example is not None:
        inputs = np.shape(example["inputs"])
        n = inputs[1] if encoder is None else inputs[0]
        kwargs["global_batch_size"] = int(n)
        if encoder is None:
            kwargs.update(input_shape=tuple(inputs), compute_dtype=dtype)
    pp = mode == "pp" or (mode is None and mesh.shape.get("stage", 1) > 1)
    if pp:
        if pipeline is None and example is None:
            raise ValueError("trainer(...) with stage > 1 pipelines the model: pass example=batch (one batch, to "
                             "choose the microbatches) or pipeline=snnjax.parallel.PipelineOptions(microbatches=M)")
    elif pipeline is not None:
        raise ValueError(f"trainer(..., pipeline=...) needs a mesh with stage > 1; {layout!r} has none")
    plan = training_plan(model, mesh, mode, pipeline=pipeline, zero_stage=zero_stage,
                         sequence_parallel=sequence_parallel,
                         time_steps=None if encoder is not None else _time_steps(example), **kwargs)
    online.check_model(model, method)
    if pp and method != "bptt":
        raise ValueError(f"trainer(..., method={method!r}) runs the time steps one after another; a pipeline (stage > "
                         "1) is not supported with it: choose a layout without stage, or method='bptt'")
    cfg = StepConfig(seed=seed, time_steps=time_steps or 0, encoder=encoder, loss=loss, compute_dtype=dtype,
                     method=method, online_updates=bool(online_updates) and method != "bptt")
    return ModelTrainer(model, plan, optimizer, cfg, donate=donate, verbose=verbose)


def training_plan(model: nnx.Module, mesh: Mesh | int, mode: str | None = None, *,
                  pipeline: PipelineOptions | None = None, **options: Any) -> parallel.Plan:
    """The parallel plan a trainer runs under (``trainer`` and the config's ``Trainer`` both plan here):
    ``snnjax.parallel.plan(model, mesh, mode=mode, pipeline=..., **options)``.

    ``mesh``: a ``Mesh``, or a device count (mode ``"auto"`` plans its own mesh). ``mode`` None on a mesh with
    stage > 1 is the pipeline, ``"pp"``, which runs with ``pipeline`` or the default ``PipelineOptions()``;
    ``pipeline`` also lets ``"auto"`` consider a pipeline, and no other mode takes one.
    """
    if mode is None and isinstance(mesh, Mesh) and mesh.shape.get("stage", 1) > 1:
        mode = "pp"
    if mode == "pp":
        pipeline = pipeline or PipelineOptions()
    elif pipeline is not None and mode != "auto":
        raise ValueError(f"a pipeline's options need mode 'pp' (a mesh with stage > 1), not mode {mode!r}")
    return parallel.plan(model, mesh, mode=mode, pipeline=pipeline, **options)


def _time_steps(example: Batch | None) -> int | None:
    return None if example is None else int(np.shape(example["inputs"])[0])


def checkpoint_step(directory: str | pathlib.Path, step: int | None = None) -> tuple[pathlib.Path, int]:
    """The checkpoint folder ``directory`` (a ``train.py`` workdir: its ``checkpoints``) and the step to read there:
    ``step`` if it has a complete checkpoint, else (``step=None``) the latest.

    Raises:
      CheckpointError: no complete checkpoint there, or none of ``step`` (the message lists the steps).
    """
    directory = pathlib.Path(directory).absolute()
    if (directory / "checkpoints").is_dir() and not complete_steps(directory):
        directory = directory / "checkpoints"  # a train.py workdir
    steps = complete_steps(directory) if directory.is_dir() else []
    if not steps:
        raise CheckpointError(f"{directory} holds no complete checkpoint: save one first (ModelTrainer.save, or "
                              "train the run with train.py --workdir)")
    if step is not None and step not in steps:
        raise CheckpointError(f"no checkpoint of step {step} in {directory}; its steps are {steps}")
    return directory, steps[-1] if step is None else step


def load_model(model: nnx.Module, directory: str | pathlib.Path, step: int | None = None) -> nnx.Module:
    """``model`` (in place, and returned) with the parameters and BatchNorm statistics of the checkpoint of
    ``step`` (default: the latest) in ``directory``, saved by ``ModelTrainer.save`` or ``train.py`` (its
    ``WORKDIR/checkpoints``) under any layout. ``model`` must be built as the one trained (same class and
    sizes); a variable missing from the checkpoint or of another shape is an error naming it. The optimizer
    state is not needed (``snnjax.deploy.run.load_run`` restores a ``train.py`` run's model with this)."""
    directory, step = checkpoint_step(directory, step)
    reader = Checkpointer(directory, read_only=True)
    try:
        saved = reader.restore_raw(step)
    finally:
        reader.close()
    flat = nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.RngState)))
    for path, var in flat:
        tree = saved["params"] if isinstance(var, nnx.Param) else saved["model_state"]
        value = _lookup(tree, path)
        where = f"{path_str(path)} ({type(var).__name__})"
        if value is None:
            raise CheckpointError(f"the checkpoint {directory / str(step)} holds no {where}: is it from another "
                                  "model class or size?")
        if tuple(np.shape(value)) != tuple(var.shape):
            raise CheckpointError(f"{where}: the model's shape is {tuple(var.shape)}, the checkpoint's "
                                  f"{tuple(np.shape(value))}; build the model with the sizes it was trained with")
        var.set_value(jnp.asarray(value, var.get_value().dtype))
    return model


def _lookup(tree, path):
    """``tree[path]`` in a restored nested dict whose integer keys may have become strings."""
    for key in path:
        if not isinstance(tree, Mapping):
            return None
        if key in tree:
            tree = tree[key]
        elif str(key) in tree:
            tree = tree[str(key)]
        else:
            return None
    return tree.get("value") if isinstance(tree, Mapping) else tree  # a Variable is saved as {"value": array}


def _pad_batch(batch: Batch, shards: int, input_axis: int) -> dict[str, np.ndarray]:
    """``batch`` with a ``mask`` (its own, else 1 per example), padded with masked copies of its first example to a
    multiple of ``shards``."""
    labels = np.asarray(batch["labels"])
    n = labels.shape[0]
    pad = -n % shards
    mask = np.asarray(batch["mask"], np.float32) if "mask" in batch else np.ones(n, np.float32)
    out = {"inputs": np.asarray(batch["inputs"]), "labels": labels, "mask": mask}
    if pad:
        axes = {"inputs": input_axis, "labels": 0, "mask": 0}
        for k, x in out.items():
            first = np.take(x, [0] * pad, axis=axes[k])
            out[k] = np.concatenate([x, np.zeros_like(first) if k == "mask" else first], axis=axes[k])
    return out


def _signature(batch: Mapping[str, jax.Array]):
    return tuple((k, v.shape, str(v.dtype)) for k, v in sorted(batch.items()))


@contextlib.contextmanager
def compile_notice(what: str, enabled: bool = True, after: float = COMPILE_NOTICE_SECONDS):
    """Print one line when compiling ``what`` is still running after ``after`` seconds, and one when done."""
    if not enabled:
        yield
        return
    t0 = time.perf_counter()
    timer = threading.Timer(after, lambda: print(f"compiling {what} (the first call of a new shape)...", flush=True))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        seconds = time.perf_counter() - t0
        if seconds >= after:
            print(f"compiled {what} in {seconds:.1f} s", flush=True)
