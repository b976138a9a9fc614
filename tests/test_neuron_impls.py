"""Every multi-step neuron implementation by name: ``xla``, ``pallas`` (interpret mode on the CPU), ``native``.

- SpikingJelly 2.0.0 golden data (``tests/fixtures/spikingjelly/neurons.*``, float64): every case
  through xla and native, the cases that hold every pair of option values through the interpreted
  Pallas kernels (of the Rect cases, one per neuron kind); spikes exactly, ``v_seq``, ``grad_x`` and
  PLIF's ``grad_w`` to 1e-10 normwise relative error.
- Hypothesis, each implementation against the path it replaces (``xla`` against plain autodiff
  ``multistep_reference``, the kernels against ``xla``): random neuron configurations (IF / LIF /
  PLIF, tau, decay_input, threshold, hard or soft reset, detach_reset, every surrogate the implementation
  runs, with random keywords: xla's also the non-spiking ones and spike counts), random T and trailing
  shapes, random or default (possibly broadcast) ``v_init``, both output forms, random cotangents on
  both outputs; for Pallas random block sizes and time chunks (the last block's rows masked; several
  chunks, a partial last one, or one for all T).
  Spikes and dtypes equal; V bit for bit (Pallas: 1e-10 in float64, 1e-5 in float32); gradients
  w.r.t. ``x_seq``, ``v_init`` and PLIF's ``w`` to 1e-10 in float64, 1e-5 in float32 (the
  kernels; native's ``w``, a sum over every neuron-step: 1e-4).
- The kernels with float32 / bfloat16 inputs (float32 state) on a problem that crosses their work
  units (Pallas: two blocks, the second partial, and three time chunks; native: two work chunks
  and a partial third): spikes and V equal the XLA path's, gradients to float32 / bfloat16 rounding
  (Pallas: each configuration in one of the dtypes).
- No ``v_init`` and a loss on the spikes alone (V's cotangent a symbolic zero), T across chunks.
- The NNX modules pass ``impl`` through: the chosen implementation runs, once.
``SNNJAX_ALL_CASES=1``: every Pallas case too, and 30 hypothesis examples per implementation (the suite: 12).
Backend-only cases (native build and chunking, Pallas GPU lowering and options) are in
``test_native.py`` and ``test_pallas.py``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import ALL_CASES, suite_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuron_checks import (
    NEURON_CONFIGS,
    assert_matches_reference,
    assert_same_run,
    low_precision_problem,
    problem_arrays,
    surrogates_for,
)

from snnjax import neurons as F
from snnjax.interop import check
from snnjax.neurons import modules as M
from snnjax.neurons import surrogate as sg
from snnjax.neurons.compare import REFERENCE, implementation, rel_error, run_vjp
from snnjax.neurons.kernels import dispatch
from snnjax.neurons.kernels import pallas as P
from snnjax.neurons.kernels.native import build

pytestmark = pytest.mark.usefixtures("x32_module")  # float64 tests turn x64 on for themselves
IMPLS = ("xla", "pallas", "native")
KERNELS = ("pallas", "native")
BASELINE = {"xla": REFERENCE, "pallas": "xla", "native": "xla"}  # the path each implementation replaces


def _multistep(impl: str, options: P.KernelOptions | None = None):
    """The multistep function a test runs: the Pallas kernels with its ``KernelOptions``, else ``impl`` by name."""
    return implementation(impl) if options is None else functools.partial(P.multistep, options=options)


@pytest.mark.parametrize("impl", ("xla", "native"))
def test_matches_spikingjelly(impl, neuron_case, x64):
    _assert_reproduces(impl, *neuron_case)


def covering_cases(cases: list[dict]) -> list[int]:
    """Indices of cases that together hold every pair of option values the cases hold (greedy)."""
    fields = sorted({k for c in cases for k in c})

    def pairs(case):
        return {(a, str(case.get(a)), b, str(case.get(b))) for i, a in enumerate(fields) for b in fields[i + 1:]}

    every, held, chosen = set().union(*map(pairs, cases)), set(), []
    while held != every:
        best = max(range(len(cases)), key=lambda i: len(pairs(cases[i]) - held))
        chosen.append(best)
        held |= pairs(cases[best])
    return sorted(chosen)


PALLAS_CASES = covering_cases(json.loads((pathlib.Path(__file__).parent / "fixtures" / "spikingjelly"
                                          / "neurons.json").read_text()))


@pytest.mark.parametrize("index", PALLAS_CASES)
def test_pallas_kernel_matches_spikingjelly(index, neuron_reference, x64):
    """The Pallas kernels (interpreted: slow on the CPU) on the cases that together hold every pair of option
    values of ``neurons.json`` (kind x reset, reset x surrogate, ...); xla and native run every case."""
    cases, arrays = neuron_reference
    _assert_reproduces("pallas", cases[index], check.case_arrays(arrays, f"case{index:03d}/"))


# Pallas (interpreted) on the Rect cases of each neuron kind: MS-ResNet's LIF (hard reset, detached, alpha 2), IF
# (soft reset, alpha 1), PLIF (hard reset, alpha 0.5); SNNJAX_ALL_CASES=1: all six.
RECT_PALLAS_CASES = suite_cases(range(6), (0, 2, 4))


@pytest.mark.parametrize("impl", IMPLS)
def test_rect_matches_spikingjelly(impl, reference_dir, x64):
    """SpikingJelly's Rect surrogate (``neurons_rect.*``): MS-ResNet's LIF and variations, with inputs on the
    window's edges, where the surrogate gradient is 0 (``|x| < 0.5 / alpha`` is strict)."""
    cases, arrays = check.load(reference_dir / "neurons_rect.npz")
    assert len(cases) == 6 and all(c["surrogate"].startswith("rect") for c in cases)
    for i in RECT_PALLAS_CASES if impl == "pallas" else range(len(cases)):
        _assert_reproduces(impl, cases[i], check.case_arrays(arrays, f"case{i:03d}/"))


def _assert_reproduces(impl: str, case: dict, a: dict) -> None:
    """One SpikingJelly neuron case through ``impl``: spikes, ``v_seq``, ``grad_x`` (and PLIF's ``grad_w``)."""
    cfg = check.neuron_config(case)
    w = jnp.asarray(check.plif_w(case, a)) if cfg.kind == "PLIF" else None
    x = jnp.asarray(a["x"])
    assert x.dtype == jnp.float64
    s, v_seq, gx, gw = check.neuron_outputs(cfg, x, jnp.asarray(a["grad_spikes"]), w, impl=impl)
    assert s.dtype == v_seq.dtype == gx.dtype == jnp.float64
    plif = {"grad_w": gw} if cfg.kind == "PLIF" and "grad_w" in a else {}
    assert_matches_reference(a, s, v_seq=v_seq, grad_x=gx, **plif)


# ---- hypothesis: each implementation against the path it replaces -----------------------

@st.composite
def _problems(draw, impl: str):
    cfg = dataclasses.replace(draw(NEURON_CONFIGS), surrogate=draw(surrogates_for(impl)))
    T = draw(st.integers(1, 12))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from(["float64"] if impl == "xla" else ["float64", "float32"]))
    options = None
    if impl == "pallas":
        # Small blocks: M is mostly not a multiple of the block, so the last block's rows are masked.
        # Chunks of 1 to T+1 steps: several full chunks, a partial last one, or one chunk for all.
        options = P.KernelOptions(block_m=draw(st.sampled_from([4, 8, 16])),
                                  block_m_backward=draw(st.sampled_from([4, 8, 16])), min_block=1,
                                  time_chunk=draw(st.integers(1, T + 1)), interpret=True)
    v_init_ndim = draw(st.one_of(st.none(), st.integers(0, len(shape))))  # None: fresh state; else a suffix
    return cfg, T, shape, dtype, draw(st.booleans()), v_init_ndim, options, draw(st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=30 if ALL_CASES else 12, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_matches_the_path_it_replaces(impl, x64, data):  # x64 stays on for all examples
    cfg, T, shape, dtype, return_v_seq, v_init_ndim, options, seed = data.draw(_problems(impl))
    x, v_init, w, ct_s, ct_v = problem_arrays(cfg, T, shape, dtype, return_v_seq, v_init_ndim, seed)
    args = (cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    got, want = run_vjp(_multistep(impl, options), *args), run_vjp(BASELINE[impl], *args)
    (s, v), _ = got
    assert s.dtype == dtype and v.dtype == dtype and v.shape == ((T, *shape) if return_v_seq else shape)
    rtol = 1e-10 if dtype == "float64" else 1e-5
    v_tol = rtol if impl == "pallas" else 0.0
    if impl == "native" and T == 1 and v_init is not None and np.ndim(v_init) < x.ndim - 1:
        # XLA drops a one-step loop and rounds a broadcast start's decay before adding X (native/neuron.py).
        # One rounding of a term apart: half an ulp of |V_0| + |X|, whatever the cancellation in V.
        v_tol = np.inf
        atol = np.finfo(dtype).eps * (np.abs(x).max() + np.abs(v_init).max())
        np.testing.assert_allclose(np.asarray(v), np.asarray(want[0][1]), rtol=0, atol=atol, err_msg="v")
    assert_same_run(got, want, v_tol=v_tol, dx=rtol, dw=1e-4 if impl == "native" and dtype == "float32" else rtol)


# ---- the kernels in float32 / bfloat16 (x64 off) -----------------------------------------

CONFIGS = {
    "IF-soft-pq": F.NeuronConfig(kind="IF", v_reset=None, surrogate=sg.PiecewiseQuadratic()),
    "LIF-hard-detach-atan": F.NeuronConfig(kind="LIF", tau=1.5, v_reset=-0.25, detach_reset=True,
                                           surrogate=sg.ATan()),
    "LIF-soft-nodi-softsign": F.NeuronConfig(kind="LIF", decay_input=False, v_reset=None, v_threshold=0.8,
                                             surrogate=sg.SoftSign()),
    "LIF-hard-nodi-vr": F.NeuronConfig(kind="LIF", tau=3.0, decay_input=False, v_reset=-0.3),
    "PLIF-hard-sigmoid": F.NeuronConfig(kind="PLIF", v_threshold=1.2),
    "LIF-hard-nodi-rect": F.NeuronConfig(kind="LIF", tau=4 / 3, decay_input=False, v_threshold=0.5,  # MS-ResNet's
                                         detach_reset=True, surrogate=sg.Rect(alpha=2.0)),
}
# A problem that crosses each kernel's work units, the last one partial, and how the kernel runs it.
SPLIT = {
    # M = 141: two blocks of 128, the second partial (masked rows); 2 time chunks and a partial one.
    "pallas": ((5, 3, 47), P.KernelOptions(block_m=128, block_m_backward=128, min_block=1, time_chunk=2,
                                            interpret=True)),
    # M = 2 work chunks + 15 neurons: a partial third chunk, run on XLA's thread pool.
    "native": ((4, 3, 2 * build.chunk_size(4, 10**6) // 3 + 5), None),
}


# Native: every config in both dtypes. Pallas (interpreted, each case its own compile): each config once, each dtype
# on three of them; SNNJAX_ALL_CASES=1: every pair.
_PAIRS = [(name, dtype) for name in sorted(CONFIGS) for dtype in ("float32", "bfloat16")]
_PALLAS_PAIRS = suite_cases(_PAIRS, list(zip(sorted(CONFIGS), ("float32", "bfloat16") * 3, strict=True)))
LOW_PRECISION_CASES = [("native", *pair) for pair in _PAIRS] + [("pallas", *pair) for pair in _PALLAS_PAIRS]


@pytest.mark.parametrize("impl,name,dtype", LOW_PRECISION_CASES)
def test_float32_and_bfloat16_inputs(impl, name, dtype):
    cfg, dtype = CONFIGS[name], jnp.dtype(dtype)
    shape, options = SPLIT[impl]
    args = (cfg, True, *low_precision_problem(cfg, shape, dtype, return_v_seq=True))
    got, want = run_vjp(_multistep(impl, options), *args), run_vjp("xla", *args)
    (s, v), (dx, _, _) = got
    assert s.dtype == dx.dtype == dtype and v.dtype == jnp.float32
    assert 0 < float(jnp.mean(s.astype(jnp.float32))) < 1, "the example should fire some but not all"
    # dx to bfloat16 rounding; dv_init and PLIF's dw are float32 (native's dw: a sum over 200k terms)
    assert_same_run(got, want, dx=1e-2 if dtype == jnp.bfloat16 else 1e-5, dv_init=1e-5,
                    dw=1e-4 if impl == "native" else 1e-5)


# Pallas's time chunks of K = 4 (each chunk's steps unrolled: a short K compiles quickly): one partial, one, two,
# three chunks (the last partial); the others have no time chunks (T = 3, 10).
@pytest.mark.parametrize("impl,T", [(impl, T) for impl in IMPLS for T in (3, 4, 8, 10)
                                    if impl == "pallas" or T in (3, 10)],
                         ids=lambda v: f"T{v}" if isinstance(v, int) else v)
@pytest.mark.parametrize("return_v_seq", [False, True], ids=["v_last", "v_seq"])
def test_default_state_and_unused_v(impl, T, return_v_seq):
    """No v_init (one start shared by every neuron) and a loss on the spikes alone (V's cotangent a symbolic zero)."""
    cfg = CONFIGS["PLIF-hard-sigmoid"]
    rng = np.random.default_rng(T)
    x = jnp.asarray(rng.normal(0.6, 0.8, (T, 5, 37)), jnp.float32)
    w, ct = jnp.asarray(0.2, jnp.float32), jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    options = P.KernelOptions(interpret=True, block_m=64, block_m_backward=64, time_chunk=4)

    def grads(impl):
        multistep = _multistep(impl, options if impl == "pallas" else None)
        loss = lambda x, w: jnp.sum(multistep(cfg, x, None, w, return_v_seq=return_v_seq)[0] * ct)  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)

    (dx, dw), (dx_want, dw_want) = grads(impl), grads(BASELINE[impl])
    assert rel_error(dx, dx_want) < 1e-5 and rel_error(dw, dw_want) < 1e-4
    assert float(jnp.linalg.norm(dx_want)) > 0


@pytest.mark.parametrize("impl", KERNELS)
def test_modules_pass_impl_through(impl, monkeypatch):
    calls = []
    chosen = dispatch.IMPLEMENTATIONS[impl]
    counted = dataclasses.replace(chosen, multistep=lambda *a, **k: calls.append(k) or chosen.multistep(*a, **k))
    monkeypatch.setitem(dispatch.IMPLEMENTATIONS, impl, counted)
    x = jnp.asarray(np.random.default_rng(1).normal(0.8, 0.8, (4, 2, 9)), jnp.float32)

    def loss(node, x):
        return jnp.sum(node(x) * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape) / x.size)

    results = {}
    for name in ("xla", impl):
        node = M.ParametricLIFNode(init_tau=3.0, v_reset=None, step_mode="m", impl=name)
        assert node.impl == name
        results[name] = nnx.value_and_grad(loss, argnums=(0, 1))(node, x)
    assert len(calls) == 1, f"impl={impl!r} should run its implementation once, impl='xla' never"
    (l_x, (g_node_x, gx_x)), (l_k, (g_node_k, gx_k)) = results["xla"], results[impl]
    assert float(l_x) == float(l_k)
    np.testing.assert_allclose(np.asarray(gx_k), np.asarray(gx_x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(float(g_node_k["w"].get_value()), float(g_node_x["w"].get_value()), rtol=1e-5)
