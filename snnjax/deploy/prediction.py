"""Predictions of a trained run: ``python -m snnjax.predict --workdir RUN --data test --out preds.jsonl``.

Loads the run's model from its ``config.json`` and checkpoint (``snnjax.deploy.run.load_run``),
runs inference with the batch split over all devices (a ``data`` mesh; parameters replicated)
and writes one JSON line per example::

    {"index": 3, "label": 7, "prediction": 7, "correct": true, "probabilities": [K floats],
     "logits": [[K floats] per time step], "spike_counts": {"neurons.0": 412, ...}}

``prediction`` is the argmax of the time-mean logits, ``probabilities`` their softmax (as the
training's evaluation scores them); ``logits`` are the per-time-step outputs ``[T, K]``;
``spike_counts`` (``--dump-spikes``) the spikes each neuron layer (keyed by its attribute path)
emitted for the example over all time steps. Batches are those of the training's evaluation
(``global_batch_size``, dataset order, the last one padded), so Poisson-encoded inputs get the
same random spikes and the accuracy printed equals ``summary.json``'s ``eval_accuracy`` for the same checkpoint.
Python: ``predict(workdir, "test")`` returns the same as arrays. One process (its devices).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.data import Loader
from snnjax.deploy.calls import neurons
from snnjax.deploy.run import RestoredRun, load_run
from snnjax.layers.conv_cpu import compiler_options
from snnjax.neurons.modules import observe
from snnjax.parallel import mesh as mesh_lib
from snnjax.train import config as config_lib
from snnjax.train.step import model_inputs

SPLITS = ("train", "test")


@dataclasses.dataclass
class Predictions:
    """Per-example results, in dataset order (``n`` examples, ``T`` steps, ``K`` classes).

    Attributes:
      labels: ``[n]`` int. predictions: ``[n]`` int (argmax of the time-mean logits).
      probabilities: ``[n, K]`` softmax of the time-mean logits. logits: ``[n, T, K]`` per time step.
      spike_counts: layer name -> ``[n]`` spikes over all time steps and neurons (``dump_spikes``), else ``{}``.
      step: the checkpoint's step. accuracy: fraction of correct predictions.
    """

    labels: np.ndarray
    predictions: np.ndarray
    probabilities: np.ndarray
    logits: np.ndarray
    spike_counts: dict[str, np.ndarray]
    step: int

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.predictions == self.labels))

    def write_jsonl(self, path: str | pathlib.Path) -> None:
        """One JSON object per example (see the module docstring)."""
        with open(path, "w") as f:
            for i in range(self.labels.shape[0]):
                row = {"index": i, "label": int(self.labels[i]), "prediction": int(self.predictions[i]),
                       "correct": bool(self.labels[i] == self.predictions[i]),
                       "probabilities": self.probabilities[i].tolist(), "logits": self.logits[i].tolist()}
                if self.spike_counts:
                    row["spike_counts"] = {k: int(v[i]) for k, v in self.spike_counts.items()}
                f.write(json.dumps(row) + "\n")


def predict(workdir: str | pathlib.Path, data: str = "test", *, checkpoint: int | None = None,
            devices: Sequence[jax.Device] | None = None, dump_spikes: bool = False) -> Predictions:
    """Run the model of ``workdir`` (checkpoint ``checkpoint``, default the latest) over ``data``.

    ``data``: ``"test"`` / ``"train"`` (the run's dataset), or a directory holding the run's dataset
    (read as its test split). ``devices``: where the batch is split (default all of them); the run's
    ``global_batch_size`` must divide by their number.
    """
    run = load_run(workdir, checkpoint)
    return predict_run(run, data, devices=devices, dump_spikes=dump_spikes)


def predict_run(run: RestoredRun, data: str = "test", *, devices: Sequence[jax.Device] | None = None,
                dump_spikes: bool = False) -> Predictions:
    """:func:`predict` for a run already loaded with ``load_run``."""
    if jax.process_count() > 1:
        raise ValueError("predict runs in one process (its devices split each batch); run it without "
                         "jax.distributed")
    source = _source(run, data)
    devices = list(devices if devices is not None else jax.devices())
    batch = run.config.global_batch_size
    if batch % len(devices):
        raise ValueError(f"the run's global_batch_size={batch} does not split over {len(devices)} devices: "
                         f"pass devices=jax.devices()[:k] (--devices K) with k dividing {batch}")
    mesh = mesh_lib.make_mesh(f"data={len(devices)}", devices)
    loader = Loader(source, batch, seed=run.config.seed, shuffle=False, drop_remainder=False,
                    process_index=0, process_count=1, prefetch=0)
    names = [name for name, _ in neurons(run.model)] if dump_spikes else []
    graphdef, state = nnx.split(run.model)
    options = compiler_options((state, run.step_config.compute_dtype), devices[0].platform)
    forward = jax.jit(_forward, static_argnums=(0, 1, 2), compiler_options=options)
    state = jax.device_put(state, mesh_lib.replicated(mesh))
    labels, logits, counts = [], [], {k: [] for k in names}
    for i, b in enumerate(loader.epoch_batches(0)):
        inputs = jax.device_put(b["inputs"], mesh_lib.batch_sharding(mesh, b["inputs"].ndim,
                                                                     1 if run.time_major else 0))
        out, spikes = forward(graphdef, run.step_config, dump_spikes, state, inputs, jnp.asarray(i))
        keep = b["mask"]
        logits.append(np.asarray(jax.device_get(out)).swapaxes(0, 1)[keep])
        labels.append(b["labels"][keep])
        for k, v in zip(names, jax.device_get(spikes), strict=True):
            counts[k].append(np.asarray(v)[keep])
    logits_all = np.concatenate(logits).astype(np.float64)
    mean = logits_all.mean(1)
    probs = np.exp(mean - mean.max(-1, keepdims=True))
    return Predictions(labels=np.concatenate(labels), predictions=mean.argmax(-1),
                       probabilities=probs / probs.sum(-1, keepdims=True), logits=logits_all,
                       spike_counts={k: np.concatenate(v) for k, v in counts.items()}, step=run.step)


def _source(run: RestoredRun, data: str):
    if data in SPLITS:
        return run.source(data)
    if pathlib.Path(data).is_dir():
        return run.source("test", data_dir=data)
    raise ValueError(f"--data {data!r} is neither a split {list(SPLITS)} nor a directory holding the run's "
                     f"dataset ({run.config.data.name})")


def _forward(graphdef, step_cfg, dump_spikes, state, inputs, index):
    """Logits ``[T, N, K]`` and, with ``dump_spikes``, each neuron's spike count per example ``[N]`` (in the order
    of ``neurons(model)``)."""
    model = nnx.merge(graphdef, state)
    key = jax.random.fold_in(jax.random.key(step_cfg.seed + 1), index)  # the eval step's encoder key
    x = model_inputs(step_cfg, inputs, key)
    if not dump_spikes:
        return model(x), []
    index_of = {id(node): i for i, (_, node) in enumerate(neurons(model))}
    counts = [jnp.zeros(x.shape[1], jnp.int32) for _ in index_of]

    def seen(node, spikes, _):
        counts[index_of[id(node)]] += jnp.sum(spikes.astype(jnp.float32), axis=(0, *range(2, spikes.ndim))
                                              ).astype(jnp.int32)

    with observe(seen):
        return model(x), counts


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m snnjax.predict", description=__doc__.split("\n")[0])
    p.add_argument("--workdir", required=True, help="the training run's directory (config.json, checkpoints/)")
    p.add_argument("--checkpoint", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--data", default="test", help="split (train, test) or a directory holding the run's dataset")
    p.add_argument("--out", required=True, help="JSON lines file to write, one line per example")
    p.add_argument("--dump-spikes", action="store_true", help="add each neuron layer's spike count per example")
    p.add_argument("--devices", type=int, default=0, help="split batches over the first K devices (0: all)")
    args = p.parse_args(argv)
    try:
        if config_lib.load(args.workdir).dtype == "float64":
            jax.config.update("jax_enable_x64", True)
        devices = jax.devices()[:args.devices] if args.devices > 0 else None
        preds = predict(args.workdir, args.data, checkpoint=args.checkpoint, devices=devices,
                        dump_spikes=args.dump_spikes)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    preds.write_jsonl(args.out)
    print(f"{len(preds.labels)} predictions (checkpoint {preds.step}) -> {args.out}; accuracy {preds.accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
