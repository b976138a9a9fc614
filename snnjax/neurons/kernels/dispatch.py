"""Which implementation runs a multi-step neuron: the table of implementations and ``auto``'s choice.

=========  ======================================================================  ===============
impl       what runs                                                               where
=========  ======================================================================  ===============
``xla``    ``lax.scan`` with a hand-written backward (``snnjax.neurons.kernels.xla``)       everywhere
``pallas`` fused multi-timestep kernels (``snnjax.neurons.kernels.pallas``); interpreted on a CPU  GPU (CPU: tests)
``native`` fused multi-timestep C++ kernels through XLA FFI (``snnjax.neurons.kernels.native``)     CPU
``scan``   ``lax.scan`` of the single step, plain autodiff (``snnjax.neurons.kernels.scan``): any neuron  everywhere
``assoc``  ``lax.associative_scan`` of a declared linear recurrence (``snnjax.neurons.kernels.assoc``)  everywhere
``auto``   ``pallas`` on a GPU, ``native`` on a CPU, ``xla`` (``scan`` for a step) otherwise (below)
=========  ======================================================================  ===============

The built-in IF / LIF / PLIF (a ``NeuronConfig``) run on every implementation; a neuron given by its single
step (a ``base.StepNeuron``: the catalogue's, a user's) on ``scan`` and on the ``native`` / ``pallas`` kernels
generated from its step (``native.codegen``, ``pallas.step``), which ``auto`` picks as for IF / LIF / PLIF (under a
layout too), falling back to ``scan`` (with the warning) where the step cannot be generated, and choosing ``scan``
for T = 1 and per block of the time split.

A neuron that declares its step the linear recurrence without reset ``V_t = a V_{t-1} + b X_t``
(``StepNeuron.linear``: the catalogue's non-spiking readouts, a user's ``linear_recurrence``) also runs on
``assoc``, equal to ``scan`` to rounding (reassociated sums), under a data / fsdp / tensor layout too (plain XLA,
which the partitioner splits); refused where the mesh splits time. ``auto`` does not pick it (``ASSOC_NOT_AUTO``:
slower than the native kernel on every measured CPU shape; unmeasured on a GPU) and says so in its reason.

All give the same spikes and states, and gradients equal to rounding. This module and
``snnjax.neurons.kernels.sharded`` are the only ones that import the kernel packages; those import only
``snnjax.neurons.base``.

Under a layout (a multi-device mesh is the current JAX mesh context, ``jax.sharding.get_abstract_mesh()``,
entered by a ``snnjax.parallel`` layout while the step is traced), ``pallas`` and ``native`` run through
``snnjax.neurons.kernels.sharded``: the SPMD partitioner sees an elementwise op over the trailing dims, keeps
the layout's sharding of them and runs the kernel on each device's block, with no gather (the time
dim stays whole). That holds inside a ``shard_map`` that leaves mesh axes automatic too (a pipeline
stage over ``stage`` with data / fsdp / tensor inside, a time segment with data inside): there the
partitioner hands over the automatic axes' tiling without names, and ``sharded`` reads it off the tiling.
Outside a layout, and inside a ``shard_map`` manual over every axis of more than one device, they run as
they are, on the local block. The kernels generated from a step run the same way, each state variable an
operand of its own with the layout's sharding and each learned scalar's gradient summed over the shards.
``choose_impl``'s reason says how the chosen path runs under the mesh context (per shard, per time block), and a
plan prints it per neuron type (``recording``; ``snnjax.parallel.neuron_paths``).

``auto`` keeps ``xla``:
- for a single step (T = 1): there is no time loop to fuse, and XLA fuses the one
  elementwise update into the neighbouring ops, which an opaque kernel call would prevent;
- where the kernels cannot run the call (``unsupported_reason``: the native kernels compute the
  Sigmoid, ATan, PiecewiseQuadratic, SoftSign and Rect surrogates, the Pallas kernels any surrogate
  whose forward is the step ``1[x >= 0]``), or the native kernels cannot be compiled on this machine.
  Then ``multistep`` warns, naming the kernel's reason; ``choose_impl`` returns the choice and why.

Under a layout whose mesh splits ``time`` (temporal parallelism), every ``impl`` runs through
``snnjax.neurons.kernels.temporal``: a pipeline over blocks of neurons, each block computed by the ``xla`` path
(``scan`` for a step; ``auto`` off the backends of ``temporal.KERNEL_BLOCK_BACKENDS``: it was faster per block
than the native kernels on the CPU) or by the kernel an explicit ``impl`` names.

Measured (``python -m snnjax.bench.neuron``, records in ``benchmarks/results/``): on an H100 the
Pallas kernels matched the ``xla`` path bit for bit over every variant and ran LIF forward +
backward 3.1-3.3x faster; on the 2-core CPU the native kernels ran 5.1-7.4x faster than
SpikingJelly's torch backend. Under a layout (2-core CPU, 8 host devices, float32 LIF over VGG's
first layer ``[4, 8, 48, 48, 128]``, forward + backward, medians of interleaved runs on a loaded
machine): sharded native 39-68 ms vs ``xla`` 96-135 ms with data=8, 20-62 ms vs 95-180 ms with
data=4 x tensor=2; the same kernel call gathered onto every device took 0.9-2.3 s.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from snnjax.neurons import base as B
from snnjax.neurons.kernels import assoc, pallas, scan, sharded, temporal, xla
from snnjax.neurons.kernels.native import build as native_build
from snnjax.neurons.kernels.native import neuron as native
from snnjax.neurons.kernels.pallas import api as pallas_api
from snnjax.recording import Recorder


@dataclasses.dataclass(frozen=True)
class Impl:
    """One implementation of the multi-step neuron.

    ``multistep(cfg, x_seq, v_init, w, *, return_v_seq)`` has the contract of ``snnjax.neurons.multistep``;
    ``unsupported_reason(cfg, shape, dtype)`` says why it cannot run a call on ``backend`` (None if it can).
    ``auto_backend``: the backend on which ``auto`` prefers it (None: never preferred).
    ``kernel``: its per-block rules, which ``snnjax.neurons.kernels.sharded`` runs under a layout (None: the partitioner
    shards ``multistep`` itself).
    """

    name: str
    multistep: Callable
    unsupported: Callable[[B.NeuronConfig, tuple, jnp.dtype], str | None]
    backends: tuple[str, ...] | None = None  # None: every backend
    auto_backend: str | None = None
    available: Callable[[], bool] = lambda: True
    kernel: sharded.Kernel | None = None
    any_neuron: bool = False  # runs a StepNeuron too (else IF / LIF / PLIF only)

    def unsupported_reason(self, cfg: B.NeuronConfig | B.StepNeuron, shape, dtype, backend: str) -> str | None:
        if not (self.any_neuron or isinstance(cfg, B.NeuronConfig)):
            return f"the {self.name} path runs the built-in IF / LIF / PLIF, not {cfg.name} (impl='scan' runs it)"
        if self.backends is not None and backend not in self.backends:
            where = " / ".join(b.upper() for b in self.backends)
            return f"the {self.name} kernels run on the {where} backend, this is {backend!r}"
        return self.unsupported(cfg, shape, dtype)


IMPLEMENTATIONS: dict[str, Impl] = {
    "xla": Impl("xla", xla.multistep, xla.unsupported_reason),
    "pallas": Impl("pallas", pallas.multistep, pallas.unsupported_reason, auto_backend="gpu", any_neuron=True,
                   kernel=sharded.Kernel("pallas", pallas_api.forward_rule, pallas_api.backward_rule)),
    "native": Impl("native", native.multistep, native.unsupported_reason, backends=("cpu",), auto_backend="cpu",
                   available=native_build.available, any_neuron=True,
                   kernel=sharded.Kernel("native", native.forward_rule, native.backward_rule, B.state_dtype)),
    "scan": Impl("scan", scan.multistep, scan.unsupported_reason, any_neuron=True),
    "assoc": Impl("assoc", assoc.multistep, assoc.unsupported_reason, any_neuron=True),
}
IMPLS = ("auto", *IMPLEMENTATIONS)


def mesh_is_partitioned() -> bool:
    """Whether the current JAX mesh context (``jax.sharding.get_abstract_mesh()``) spans more than one device."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and mesh.size > 1


def partitioner_splits() -> bool:
    """Whether the current mesh context leaves mesh axes of more than one device to the SPMD partitioner (a
    layout's mesh, or a ``shard_map`` that is manual over some axes only)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and math.prod(mesh.shape[a] for a in mesh.axis_names if a not in mesh.manual_axes) > 1


class Choice(NamedTuple):
    """The implementation that runs a call, and why: for ``auto``, which kernel the backend prefers and, where
    that kernel cannot run the call (``refused``), the reason it gives."""

    impl: str
    why: str
    refused: bool = False


# Why ``auto`` leaves the ``assoc`` path to an explicit choice. Measured (python -m snnjax.bench.neuron --neuron
# NonSpikingLIFNode --impls auto scan assoc; benchmarks/results/neuron_assoc_cpu.jsonl): float32 forward + backward
# over [T, 64, C], 2-core CPU, one run under a load of 3-12; assoc's time / auto's (the native kernel):
#   C = 256:   T = 8 2.0x, 32 1.8x, 128 2.1x, 512 2.8x     (/ scan's: 0.37x, 1.4x, 1.9x, 3.0x)
#   C = 2048:  T = 8 1.7x, 32 5.1x, 128 5.9x, 512 3.8x     (/ scan's: 1.2x, 1.7x, 1.9x, 1.5x)
#   C = 16384: T = 8 4.5x, 32 4.0x, 128 3.4x               (/ scan's: 3.8x, 1.3x, 1.8x)
# The scan's log2(T) levels each read and write the whole [T, ...] array; the native kernel passes over it once.
# On a GPU, where the sequential steps are what costs, long T is where it should win: unmeasured there.
ASSOC_NOT_AUTO = ("not assoc (the associative scan of its declared linear recurrence): on the CPU it took 1.7-5.9x the "
                  "time of the native kernel generated from the step over T = 8..512 and [64, 256]..[64, 16384]; "
                  "unmeasured on a GPU")


def choose_impl(impl: str, cfg: B.NeuronConfig | B.StepNeuron, x_seq) -> Choice:
    """The implementation (``"xla"``, ``"pallas"``, ``"native"``, ``"scan"`` or ``"assoc"``) that runs ``impl`` for
    this call, and why.

    An explicit ``"pallas"``, ``"native"`` or ``"assoc"`` that cannot run this call raises ValueError saying why
    (``snnjax.neurons.kernels.native.build.NativeBuildError`` where the native kernels cannot be compiled).
    See the module docstring for ``auto``.
    """
    choice = _choose(impl, cfg, x_seq)
    if impl == "auto" and choice.impl != "assoc" and IMPLEMENTATIONS["assoc"].unsupported_reason(
            cfg, (), None, jax.default_backend()) is None:
        choice = choice._replace(why=f"{choice.why}; {ASSOC_NOT_AUTO}")
    return choice


def _choose(impl: str, cfg: B.NeuronConfig | B.StepNeuron, x_seq) -> Choice:
    """``choose_impl`` before its note on the ``assoc`` path."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    backend = jax.default_backend()
    shape, dtype = jnp.shape(x_seq), jnp.result_type(x_seq)
    step_neuron = not isinstance(cfg, B.NeuronConfig)
    if impl != "auto":
        reason = IMPLEMENTATIONS[impl].unsupported_reason(cfg, shape, dtype, backend)
        if reason is None and impl == "assoc" and temporal.applies(x_seq):
            reason = (f"the mesh splits time, and the time-sharded pipeline runs {cfg.name}'s segments on the scan "
                      "path (assoc has no pipeline over time segments)")
        if reason is not None:
            other = "'scan'" if step_neuron else "'xla'"
            raise ValueError(f"impl={impl!r} cannot run this neuron call: {reason}; use impl={other} (or 'auto')")
        return Choice(impl, f"impl={impl!r} was asked for{_placement(impl, x_seq)}")
    fallback = "scan" if step_neuron else "xla"
    if shape[:1] in ((), (1,)):
        return Choice(fallback, "a single step (T = 1) has no time loop to fuse; XLA fuses it into the neighbouring "
                      "ops")
    if temporal.applies(x_seq) and backend not in temporal.KERNEL_BLOCK_BACKENDS:
        where = ", ".join(temporal.KERNEL_BLOCK_BACKENDS) or "none yet"
        return Choice(fallback, f"under the time split the {fallback} path computes each block of neurons: auto runs "
                      f"a fused kernel per block only on the backends of temporal.KERNEL_BLOCK_BACKENDS ({where}; on "
                      "the CPU the xla path per block measured faster than the native kernels, see "
                      f"snnjax.neurons.kernels.temporal){_placement(fallback, x_seq)}")
    preferred = [c for c in IMPLEMENTATIONS.values() if c.auto_backend == backend]
    if not preferred:
        why = f"no fused kernel is preferred on the {backend!r} backend"
        return Choice(fallback, f"{cfg.name} is given by its single step; {why}" if step_neuron else why)
    refusals = []
    for candidate in preferred:
        reason = candidate.unsupported_reason(cfg, shape, dtype, backend)
        if reason is None and not candidate.available():
            reason = "they cannot be built on this machine (impl='native' raises the compiler's message)"
        if reason is None:
            what = f"generated from {cfg.name}'s step " if step_neuron else ""
            return Choice(candidate.name, f"the {candidate.name} kernels {what}are the {backend!r} backend's fused "
                          f"path{_placement(candidate.name, x_seq)}")
        refusals.append(f"the {candidate.name} kernels cannot run it: {reason}")
    return Choice(fallback, "; ".join(refusals) + _placement(fallback, x_seq), refused=True)


def _placement(name: str, x_seq) -> str:
    """How ``name`` runs under the current mesh context: per time block, per shard, or (nothing said) as it is."""
    kernel = IMPLEMENTATIONS[name].kernel is not None
    if temporal.applies(x_seq):
        how = "one block of neurons per device and tick (snnjax.neurons.kernels.temporal)"
        if temporal.other_axes_split():
            how += (", each block on every device's shard of the other axes"
                    + (" (snnjax.neurons.kernels.sharded)" if kernel else ""))
        return f"; T is split over the mesh axis time: {how}"
    if partitioner_splits():
        return ("; under the layout it runs on each device's shard of the neurons (snnjax.neurons.kernels.sharded)"
                if kernel else "; under the layout the SPMD partitioner shards it like any elementwise op")
    return ""


def resolve_impl(impl: str, cfg: B.NeuronConfig | B.StepNeuron, x_seq) -> str:
    """The implementation (``"xla"``, ``"pallas"``, ``"native"``, ``"scan"`` or ``"assoc"``) that runs ``impl``
    for this call (``choose_impl`` without its reason)."""
    return choose_impl(impl, cfg, x_seq).impl


def neuron_name(cfg: B.NeuronConfig | B.StepNeuron) -> str:
    """What messages and the profiler's ``neuron_<NAME>`` scope call the neuron: its kind, or a StepNeuron's name."""
    return cfg.kind if isinstance(cfg, B.NeuronConfig) else cfg.name


_RECORD = Recorder("snnjax_neuron_choices")


def recording():
    """Collect ``(neuron name, input shape, Choice)`` of every multi-step neuron call traced within this context
    (what a plan reports: ``snnjax.parallel.neuron_paths``)."""
    return _RECORD.recording()


def _chosen(impl: str, cfg: B.NeuronConfig | B.StepNeuron, x_seq) -> str:
    """``resolve_impl``, warning where ``auto`` runs ``xla`` because the backend's kernel refused the call."""
    choice = choose_impl(impl, cfg, x_seq)
    _RECORD.add((neuron_name(cfg), tuple(jnp.shape(x_seq)), choice))
    if choice.refused:
        warnings.warn(f"impl='auto' runs this {neuron_name(cfg)} neuron with the {choice.impl} path: {choice.why}",
                      stacklevel=3)
    return choice.impl


def multistep(cfg: B.NeuronConfig | B.StepNeuron, x_seq: jax.Array, v_init=None, w=None, *,
              return_v_seq: bool = False, impl: str = "auto"):
    """Multi-step neuron over ``x_seq [T, ...]`` from ``v_init`` (default: the fresh state).

    Returns ``(spikes [T, ...] in x's dtype, v)``, ``v`` the state sequence ``[T, ...]`` if ``return_v_seq``
    else the final state ``[...]`` (state dtype). Gradients flow to ``x_seq``, ``v_init`` and PLIF's ``w``
    (a scalar; None for IF / LIF). A ``StepNeuron`` takes its params pytree as ``w`` (``scan.multistep``).
    ``impl``: see the module docstring.
    """
    if isinstance(cfg, B.NeuronConfig):
        B.check_decay_param(cfg, w)
    with jax.named_scope(f"neuron_{neuron_name(cfg)}"):  # profiles and HLO name the neuron's ops (train.profiling)
        if temporal.applies(x_seq):  # the mesh context splits time: the pipelined neuron
            kernel = IMPLEMENTATIONS[_chosen(impl, cfg, x_seq)].kernel
            return temporal.multistep(cfg, x_seq, v_init, w, return_v_seq=return_v_seq, kernel=kernel)
        chosen = IMPLEMENTATIONS[_chosen(impl, cfg, x_seq)]
        if chosen.kernel is not None and partitioner_splits():
            return sharded.multistep(chosen.kernel, cfg, x_seq, v_init, w, return_v_seq=return_v_seq)
        return chosen.multistep(cfg, x_seq, v_init, w, return_v_seq=return_v_seq)
