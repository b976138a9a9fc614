"""What several test modules share (tests/ is on the tests' ``sys.path``; a test module never imports another).

* ``suite_cases``: the suite's covering subset of a combination matrix (``SNNJAX_ALL_CASES=1``: every case).
* Paths and processes: ``ROOT``, ``load_config``, ``child_env``, ``launch_cmd``, ``start_until_checkpoint``.
* Layout equivalence (float64, against one device): ``layout_model``, ``initial_state``, ``three_steps``,
  ``train_layout`` (plan, three Adam steps, unpack) and ``assert_same_training`` (loss, gradients, parameters,
  optimizer state and BatchNorm statistics within ``TOL``), with ``rel``, ``flat``, ``neuron_kernels`` and
  ``gathered_dims`` to read results and compiled HLO.
* Deployment models: ``F64``, ``deploy_model``, ``randomize_batch_norm``, ``gesture_sequential``.
* Event files in the real binary formats: ``random_events``, ``nmnist_bytes``, ``AEDAT_HEADER``, ``aedat_bytes``,
  ``random_aedat``, ``write_cifar10dvs``.
* ``native_kernel``: the native CPU neuron kernel, or a skip where it cannot be built.
* ``AdaptiveLIF``: a user-written neuron with two state variables and a learned parameter.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import pathlib
import re
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import COMPILE_SPEED_FLAGS
from flax import nnx

from snnjax import Sequential, layers, parallel
from snnjax.data.cifar10dvs import CIFAR10DVS_CLASS_NAMES
from snnjax.models import CIFAR10DVSVGG, Spikformer, SpikingMLP
from snnjax.neurons import BaseNode, LIFNode
from snnjax.neurons.kernels import dispatch
from snnjax.parallel import mesh as mesh_lib
from snnjax.runtime import distributed
from snnjax.train import apply_plan
from snnjax.train import config as config_lib
from snnjax.train.step import TrainState, split_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The suite runs on 2 cores within 12 minutes: of a matrix of combinations (model family x layout x schedule, ...)
# it runs a covering subset in which every value of every factor appears at least once; SNNJAX_ALL_CASES=1 runs
# every combination (by hand, before a change to the layouts, pipeline or zoo lands; about 25 minutes on 2 cores).
ALL_CASES = os.environ.get("SNNJAX_ALL_CASES") == "1"


def suite_cases(every: Sequence, suite: Sequence) -> list:
    """``every`` under ``SNNJAX_ALL_CASES=1``, else ``suite`` (each of its cases must be one of ``every``)."""
    missing = [case for case in suite if case not in every]
    assert not missing, f"suite cases not in the matrix: {missing}"
    return list(every) if ALL_CASES else list(suite)

# ----------------------------------------------------------------------------- paths and processes


def load_config(name: str, *overrides: str, **values):
    """``configs/<name>.py`` through the config loader (``snnjax.train.config.load``) with ``--config.KEY=VALUE``
    ``overrides``, then the top-level ``values`` (``num_steps=12``) set."""
    c = config_lib.load(ROOT / "configs" / f"{name}.py", overrides)
    for key, value in values.items():
        c[key] = value
    return c


CLUSTER_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
                "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX", "TPU_WORKER_HOSTNAMES",
                "TPU_PROCESS_ADDRESSES")


def child_env(**extra) -> dict[str, str]:
    """This environment without job settings (children set their own devices and ranks)."""
    env = {k: v for k, v in os.environ.items()
           if k not in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID,
                        distributed.ENV_COLLECTIVE_TIMEOUT, *CLUSTER_VARS)}
    if "XLA_FLAGS" in extra:  # the suite's compile-speed flags stay (the same numerics as this process)
        extra["XLA_FLAGS"] = f"{COMPILE_SPEED_FLAGS} {extra['XLA_FLAGS']}"
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **extra)
    return env


def launch_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "snnjax.runtime.launch", *map(str, args)]


def start_until_checkpoint(cmd: list[str], workdir, **popen_kwargs) -> subprocess.Popen:
    """Start ``cmd`` (a train.py run in ``workdir``) and return once its first checkpoint exists, still running."""
    proc = subprocess.Popen(cmd, cwd=ROOT, **popen_kwargs)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (workdir / "checkpoints").exists() and any(p.name.isdigit() for p in (workdir / "checkpoints").iterdir()):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    return proc


# ----------------------------------------------------------------------------- layout equivalence

TOL = 1e-9
BATCH = 8
# The partitioning under test happens in XLA's HLO passes; LLVM's optimisation level only changes how fast
# the tests compile (about 2x on CPU), not what is partitioned.
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def layout_model(name: str):
    """``(model, batch shape [T, N, ...])`` of a small float64 ``"mlp"``, ``"vgg"`` or ``"spikformer"``."""
    kw = dict(rngs=nnx.Rngs(0), dtype=jnp.float64, param_dtype=jnp.float64)
    if name == "mlp":  # two hidden layers: a column/row pair, BatchNorm on both
        return SpikingMLP(16, (16, 16), 10, batch_norm=True, **kw), (2, BATCH, 4, 4, 1)
    if name == "vgg":
        return (CIFAR10DVSVGG(widths=(8, 8, 16, 16, 16, 16, 16, 16), image_size=16, dropout=0.0, **kw),
                (2, BATCH, 16, 16, 2))
    # 8 heads of 4 channels: tensor=8 puts one whole head on each device; the 4-channel stem stage
    # does not divide by 8 and stays whole (the divisibility fallback).
    return (Spikformer(T=2, img_size_h=32, img_size_w=32, in_channels=2, num_classes=10, embed_dims=32, num_heads=8,
                       depths=1, mlp_ratio=2, **kw), (2, BATCH, 32, 32, 2))


def initial_state(model, shape):
    """``(model, graphdef, Adam, host TrainState, a spike-like float64 batch of shape, labels)``."""
    graphdef, params, rngs, rest = split_model(model)
    tx = optax.adam(1e-2)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=tx.init(params))
    x = (jax.random.uniform(jax.random.key(1), shape) < 0.4).astype(jnp.float64) * 1.5
    return model, graphdef, tx, jax.device_get(state), x, jnp.arange(BATCH) % 10


def three_steps(plan, host_state, cfg, graphdef, tx, x, y):
    """``(first step's metrics, state after 3 steps, compiled step)``: ``plan`` applied, 3 steps on ``(x, y)``."""
    state, step = apply_plan(plan, host_state, cfg, graphdef, tx, batch_axes={"inputs": 1, "labels": 0},
                             batch_ndims={"inputs": 5, "labels": 1})
    batch = {"inputs": jax.device_put(x, plan.batch_sharding(5, 1)),
             "labels": jax.device_put(y, plan.batch_sharding(1, 0))}
    compiled = step.lower(state, batch).compile(compiler_options=COMPILER_OPTIONS)
    state, first = compiled(state, batch)
    for _ in range(2):
        state, _ = compiled(state, batch)
    return first, state, compiled


def train_layout(setup, cfg, mesh_spec: str | None = None, *, report: bool = False, **plan_kwargs):
    """Plan, train three steps, unpack: ``(first-step metrics, state after 3 steps, plan, compiled step, step
    report or None)``.

    ``setup``: ``initial_state``'s tuple (its host state is copied: the step donates its input). ``mesh_spec``:
    a mesh of exactly the devices it names, planned with ``plan_kwargs`` (``parallel.plan``'s keywords); None: one
    device, ``mode="none"``. ``report``: ``parallel.step_report`` of the compiled step and its (packed) state.
    Metrics and state come back on the host, a pipeline's packed parameter rows unpacked into the model's trees.
    """
    model, graphdef, tx, host_state, x, y = setup
    if mesh_spec is None:
        plan = parallel.plan(model, mesh_lib.make_mesh("data=1", jax.devices()[:1]), mode="none")
    else:
        size = int(np.prod(list(mesh_lib.parse_mesh_spec(mesh_spec).values())))
        plan = parallel.plan(model, mesh_lib.make_mesh(mesh_spec, jax.devices()[:size]), **plan_kwargs)
    host_state = jax.tree.map(lambda a: a.copy(), host_state)
    first, state, compiled = three_steps(plan, host_state, cfg, graphdef, tx, x, y)
    step_report = parallel.step_report(compiled, state) if report else None
    if plan.packing is not None:  # each device held its stages' parameters: compare the trees
        state = plan.packing.unpack_state(state)
        first = dict(first, grads=plan.packing.unpack(first["grads"]))
    return jax.device_get(first), jax.device_get(state), plan, compiled, step_report


def assert_same_training(first, state, ref_first, ref_state, *, metrics=("loss",), tol: float = TOL):
    """Three steps trained as the reference did: the first step's ``metrics`` and gradients, and after three steps
    the parameters, optimizer state and BatchNorm statistics, within ``tol`` (normwise relative).

    A conv / linear bias followed by train-mode BatchNorm has an analytically zero gradient: both sides are
    rounding noise there, so each gradient is compared against ``max(||ref||, 1e-3 ||all reference gradients||)``;
    the state parts as one vector each.
    """
    for name in metrics:
        assert rel(first[name], ref_first[name]) <= tol, (name, first[name], ref_first[name])
    scale = 1e-3 * np.linalg.norm(flat(ref_first["grads"]))
    grads, ref_grads = jax.tree.leaves(first["grads"]), jax.tree.leaves(ref_first["grads"])
    assert len(grads) == len(ref_grads), (len(grads), len(ref_grads))
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        err = np.linalg.norm(np.asarray(g) - np.asarray(r)) / max(np.linalg.norm(np.asarray(r)), scale)
        assert err <= tol, (f"gradient {i}", err)
    for part in ("params", "model_state", "opt_state"):
        assert rel(flat(getattr(state, part)), flat(getattr(ref_state, part))) <= tol, part
    assert int(state.step) == int(ref_state.step) == 3


def rel(a, b) -> float:
    """``||a - b|| / ||b||`` over the flattened arrays (``||a - b||`` where ``b`` is zero)."""
    a, b = np.ravel(np.asarray(a, np.float64)), np.ravel(np.asarray(b, np.float64))
    denom = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / denom) if denom else float(np.linalg.norm(a - b))


def flat(tree) -> np.ndarray:
    """Every leaf of ``tree``, flattened into one float64 vector."""
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def neuron_kernels(hlo: str) -> dict[str, list[int]]:
    """The native neuron kernel calls of a compiled step (the hand-written ``SnnNeuron*``, the generated
    ``SnnStep*``): target -> sorted neurons per call (``m`` of ``[T, m]``)."""
    calls = collections.defaultdict(list)
    for line in hlo.splitlines():
        match = re.search(r'custom_call_target="(Snn(?:Neuron|Step)\w+)", '
                          r'operand_layout_constraints=\{f64\[\d+,(\d+)\]', line)
        if match and " custom-call(" in line:
            calls[match.group(1)].append(int(match.group(2)))
    return {target: sorted(ms) for target, ms in calls.items()}


def gathered_dims(hlo: str) -> list[tuple[int, int]]:
    """``(dimension, its gathered size)`` of every all-gather in a compiled module's text."""
    out = []
    for line in hlo.splitlines():
        match = re.search(r"= \w+\[([\d,]*)\][^=]* all-gather\(.*dimensions=\{(\d+)\}", line)
        if match:
            dim = int(match.group(2))
            out.append((dim, int(match.group(1).split(",")[dim])))
    return out


# ----------------------------------------------------------------------------- deployment models

F64 = {"dtype": jnp.float64, "param_dtype": jnp.float64}


def randomize_batch_norm(model, seed=0):
    """Running statistics and affine parameters away from (0, 1), so eval-mode BatchNorm is not the identity,
    with a positive shift that keeps every layer firing."""
    for i, (_, m) in enumerate(nnx.iter_modules(model)):
        if hasattr(m, "mean") and isinstance(m.mean, nnx.BatchStat):
            rng = np.random.default_rng(seed + i)
            m.mean[...] = jnp.asarray(0.2 * rng.normal(size=m.mean.shape))
            m.var[...] = jnp.asarray(rng.uniform(0.5, 1.5, m.var.shape))
            m.scale[...] = jnp.asarray(rng.uniform(1.0, 2.0, m.scale.shape))
            m.bias[...] = jnp.asarray(rng.uniform(0.3, 0.9, m.bias.shape))


def deploy_model(name):
    """``(model, input shape [T, N, ...], input scale)`` of a small float64 model whose every layer fires:
    ``"mlp"``, ``"vgg"``, ``"user"`` (a ``Sequential`` built by hand), ``"spikformer"`` or ``"dvs_gesture"``."""
    if name == "mlp":
        return SpikingMLP(16, (48, 32), 5, tau=1.5, rngs=nnx.Rngs(0), **F64), (6, 3, 4, 4, 1), 4.0
    if name == "vgg":
        vgg = CIFAR10DVSVGG(widths=(8, 16, 16, 16), pools=(False, True, False, True), image_size=16, num_classes=4,
                            rngs=nnx.Rngs(1), **F64)
        randomize_batch_norm(vgg)
        return vgg, (5, 2, 16, 16, 2), 2.0
    if name == "user":  # built by hand, not from specs; flattens in torch's order (layers.Flatten's default)
        rngs = nnx.Rngs(3)
        net = Sequential(layers.conv2d(2, 6, 3, padding=1, rngs=rngs, **F64), layers.BatchNorm(6, **F64),
                         LIFNode(tau=2.0, step_mode="m"), layers.AvgPool2d(2), layers.Flatten(),
                         layers.dropout(0.5), layers.linear(6 * 4 * 4, 3, rngs=rngs, **F64))
        randomize_batch_norm(net)
        return net, (4, 2, 8, 8, 2), 3.0
    if name == "spikformer":  # attention and residuals: not a chain, but every layer acts on each step on its own
        net = Spikformer(img_size_h=32, img_size_w=32, in_channels=2, embed_dims=16, num_heads=2, depths=1,
                         num_classes=3, rngs=nnx.Rngs(4), **F64)
        randomize_batch_norm(net)
        for _, m in nnx.iter_modules(net):  # a larger shift: every LIF (tau 2) of the small net fires
            if isinstance(m, layers.BatchNorm):
                m.bias[...] = m.bias[...] + 0.6
        return net, (3, 2, 32, 32, 2), 1.0
    net = gesture_sequential((16, 16, 2), channels=8, num_classes=3, blocks=2, hidden=16, pool="max",
                             rngs=nnx.Rngs(2), **F64)
    randomize_batch_norm(net)
    net.layers[10].kernel[...] = 4.0 * np.asarray(net.layers[10].kernel[...])  # the hidden layer: drive to fire
    return net, (4, 2, 16, 16, 2), 3.0



def gesture_sequential(in_shape: Sequence[int], channels: int, num_classes: int, *, blocks: int, hidden: int,
                       pool: str, rngs: nnx.Rngs, **dtypes: Any) -> Sequential:
    """A small DVSGestureNet-like ``Sequential`` (the form streaming, export and NIR take): ``blocks`` x
    [Conv3x3 (no bias) -> BatchNorm -> LIF -> ``pool`` 2], flatten, Linear(hidden) -> LIF, Linear(num_classes);
    LIF tau 2, hard reset to 0, ``detach_reset``; ``pool`` ``"max"`` or ``"avg"``."""
    cell = {"kind": "neuron", "type": "LIF", "tau": 2.0, "detach_reset": True}
    specs: list[dict[str, Any]] = []
    for _ in range(blocks):
        specs += [{"kind": "conv", "features": channels, "kernel": 3, "padding": 1, "bias": False},
                  {"kind": "batchnorm"}, dict(cell), {"kind": f"{pool}pool", "size": 2}]
    specs += [{"kind": "flatten"}, {"kind": "dropout"}, {"kind": "linear", "features": hidden}, dict(cell),
              {"kind": "dropout"}, {"kind": "linear", "features": num_classes}]
    return Sequential.from_specs(in_shape, specs, rngs=rngs, **dtypes)


# ----------------------------------------------------------------------------- event files

def random_events(rng, n, height, width, t_max=(1 << 23) - 1):
    t = np.sort(rng.integers(0, t_max, n))
    return t, rng.integers(0, width, n), rng.integers(0, height, n), rng.integers(0, 2, n)


def nmnist_bytes(t, x, y, p):
    """One 40-bit record per event: x, y, polarity bit + 23-bit timestamp (big-endian)."""
    out = bytearray()
    for ti, xi, yi, pi in zip(t.tolist(), x.tolist(), y.tolist(), p.tolist(), strict=True):
        out += bytes([xi, yi, (pi << 7) | (ti >> 16), (ti >> 8) & 0xFF, ti & 0xFF])
    return bytes(out)


AEDAT_HEADER = (b"#!AER-DAT2.0\r\n"
                b"# This is a raw AE data file - do not edit\r\n"
                b"# Data format is int32 address, int32 timestamp (8 bytes total)\r\n"
                b"# Timestamps tick is 1 us\r\n"
                b"#!END-HEADER\r\n")


def aedat_bytes(t, x_raw, y_raw, pol, junk_bits):
    """Header + big-endian (address, timestamp) pairs; ``junk_bits`` set bits the decoder must ignore."""
    out = bytearray(AEDAT_HEADER)
    for ti, xi, yi, pi, ji in zip(t.tolist(), x_raw.tolist(), y_raw.tolist(), pol.tolist(),
                                  junk_bits.tolist(), strict=True):
        out += struct.pack(">II", (yi << 8) | (xi << 1) | pi | ji, ti)
    return bytes(out)


def random_aedat(rng, n):
    t = np.sort(rng.integers(0, 2**31, n))
    x_raw, y_raw, pol = rng.integers(0, 128, n), rng.integers(0, 128, n), rng.integers(0, 2, n)
    junk = rng.choice(np.array([0, 1 << 15, 1 << 20, 1 << 31], np.int64), n)
    junk[0] = 1 << 31  # the first data byte is >= 0x80: not text, so the header skip stops there
    return t, x_raw, y_raw, pol, junk


def write_cifar10dvs(root, files_per_class, n_events=60, seed=3):
    """Writes ``root/<class name>/cifar10_<class name>_<i>.aedat``; returns ``{path: (label, events)}``."""
    rng = np.random.default_rng(seed)
    written = {}
    for label, name in enumerate(CIFAR10DVS_CLASS_NAMES):
        (root / name).mkdir(parents=True)
        for i in range(files_per_class[label]):
            events = random_aedat(rng, n_events)
            path = root / name / f"cifar10_{name}_{i}.aedat"
            path.write_bytes(aedat_bytes(*events))
            written[path] = (label, events)
    return written


# ----------------------------------------------------------------------------- native kernels

def native_kernel():
    """The native CPU neuron kernel; skips the test where it cannot be built."""
    impl = dispatch.IMPLEMENTATIONS["native"]
    if not impl.available():
        pytest.skip("the native CPU kernels cannot be built here")
    return impl.kernel


def sj_python() -> str | None:
    """An interpreter with torch and spikingjelly: $SNNJAX_SJ_PYTHON, else this one if it has them, else None."""
    if os.environ.get("SNNJAX_SJ_PYTHON"):
        return os.environ["SNNJAX_SJ_PYTHON"]
    return sys.executable if all(importlib.util.find_spec(m) for m in ("torch", "spikingjelly")) else None


# ----------------------------------------------------------------------------- trackers


def wandb_history(run_file) -> list[dict[str, float]]:
    """The logged rows of an offline wandb run file (``wandb/offline-run-*/run-*.wandb``), ``_``-keys dropped.

    The file is wandb's record log: a 7-byte header, then 32 KiB blocks of chunks (crc32c, length, kind: 1 full,
    2 first, 3 middle, 4 last) holding ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2  # noqa: PLC0415 (only the tracker tests import wandb)

    data, pos, block, rows, pending = pathlib.Path(run_file).read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        pending = (b"" if kind in (1, 2) else pending) + data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record.FromString(pending)
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                rows.append({k: float(v) for k, v in items.items() if not k.startswith("_") or k == "_step"})
    return rows


AEDAT31_HEADER = b"#!AER-DAT3.1\r\n#Format: RAW\r\n#Source 1: DVS128\r\n#!END-HEADER\r\n"


def aedat31_packet(kind, events, overflow, size=8):
    """One AEDAT 3.1 packet: 28-byte header, then ``events`` as (data word, timestamp) pairs."""
    out = struct.pack("<hhiiiiii", kind, 1, size, 4, overflow, len(events), len(events), len(events))
    for data, ts in events:
        out += struct.pack("<Ii", data, ts)
    return out


def aedat31_event_word(x, y, p, valid=1):
    return (x << 17) | (y << 2) | (p << 1) | valid


def ragged(arrays):
    arrays = list(arrays)
    out = np.empty(len(arrays), dtype=object)
    out[:] = list(arrays)
    return out


def write_shd_h5(path, samples, labels):
    """An SHD/SSC release file: ``samples`` of (float16 times, uint16 units), ``labels``."""
    import h5py  # noqa: PLC0415

    with h5py.File(path, "w") as f:
        f.create_dataset("spikes/times", data=ragged(s[0] for s in samples), dtype=h5py.vlen_dtype(np.float16))
        f.create_dataset("spikes/units", data=ragged(s[1] for s in samples), dtype=h5py.vlen_dtype(np.uint16))
        f.create_dataset("labels", data=np.asarray(labels, np.uint16))


# ----------------------------------------------------------------------------- user-written neurons


class AdaptiveLIF(BaseNode):
    """A user-written adaptive-threshold LIF: the threshold ``th`` jumps by ``beta`` on a spike and decays back
    to ``v_threshold`` with ``tau_th``; ``tau`` is learned (``1/tau = sigmoid(w)``, read as ``self.w``)."""

    def __init__(self, beta=0.3, tau_th=4.0, **kwargs):
        self.beta, self.tau_th = beta, tau_th
        self.w = nnx.Param(jnp.asarray(0.2))
        super().__init__(**kwargs)

    def initial_state(self):
        return {"v": 0.0, "th": self.v_threshold}

    def neuronal_charge(self, x, v, params):
        return {**v, "v": v["v"] + (x - v["v"]) * jax.nn.sigmoid(self.w[...])}

    def neuronal_fire(self, h, params):
        return self.surrogate_function(h["v"] - h["th"])

    def neuronal_reset(self, h, spike, params):
        th = h["th"] + (self.v_threshold - h["th"]) / self.tau_th + self.beta * spike
        return {"v": h["v"] * (1.0 - spike), "th": th}
