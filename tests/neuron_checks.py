"""What the neuron tests share: hypothesis strategies, the arrays of one drawn problem, and the checks
that two runs of ``snnjax.neurons.compare.run_vjp`` agree or that a run reproduces a SpikingJelly case."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from snnjax import neurons as F
from snnjax.neurons import compare
from snnjax.neurons import surrogate as sg

SURROGATES = st.one_of(
    st.builds(sg.Sigmoid, alpha=st.floats(0.5, 8.0)),
    st.builds(sg.ATan, alpha=st.floats(0.5, 8.0)),
    st.builds(sg.PiecewiseQuadratic, alpha=st.floats(0.25, 4.0)),
    st.builds(sg.SoftSign, alpha=st.floats(0.5, 8.0)),
    st.builds(sg.Rect, alpha=st.floats(0.25, 4.0)),
)

# Every other surrogate, and non-spiking ones (real-valued "spikes"), for the xla path (and its heaviside ones for
# Pallas): ``surrogates_for(impl)`` draws what an implementation runs.
_STEP_SURROGATES = st.one_of(
    SURROGATES,
    st.builds(sg.PiecewiseExp, alpha=st.floats(0.5, 4.0)),
    st.builds(sg.SuperSpike, alpha=st.floats(0.5, 4.0)),
    st.builds(sg.NonzeroSignLogAbs, alpha=st.floats(0.5, 4.0)),
    st.builds(sg.Erf, alpha=st.floats(0.5, 4.0)),
    st.builds(sg.PiecewiseLeakyReLU, w=st.floats(0.2, 2.0), c=st.floats(0.0, 0.1)),
    st.builds(sg.SquarewaveFourierSeries, n=st.integers(1, 4), T_period=st.floats(2.0, 10.0)),
    st.builds(sg.S2NN, alpha=st.floats(0.5, 8.0), beta=st.floats(0.2, 2.0)),
    st.builds(sg.QPseudoSpike, alpha=st.floats(1.2, 4.0)),
    st.builds(sg.LeakyKReLU, leak=st.floats(0.0, 0.5), k=st.floats(0.5, 2.0)),
    st.builds(sg.FakeNumericalGradient, alpha=st.floats(0.1, 1.0)),
    st.builds(sg.LogTailedReLU, alpha=st.floats(0.0, 0.5)),
    st.builds(sg.DeterministicPass),
)
_ANY_SURROGATE = st.one_of(
    _STEP_SURROGATES,
    st.builds(sg.MultiLevelSpikeCount, max_spike_count=st.integers(1, 3), spiking=st.booleans()),
    st.builds(sg.Sigmoid, alpha=st.floats(0.5, 8.0), spiking=st.just(False)),
    st.builds(sg.PiecewiseLeakyReLU, w=st.floats(0.2, 2.0), spiking=st.just(False)),
    st.builds(sg.DeterministicPass, spiking=st.just(False)),
)


def surrogates_for(impl: str):
    """The surrogates ``impl`` runs: every one (xla), those whose forward is the step (pallas), five (native)."""
    return {"xla": _ANY_SURROGATE, "pallas": _STEP_SURROGATES}.get(impl, SURROGATES)


# Every neuron variant: IF / LIF / PLIF, tau, decay_input, threshold, soft / zero / other
# hard reset, detach_reset, any surrogate.
NEURON_CONFIGS = st.builds(
    F.NeuronConfig,
    kind=st.sampled_from(["IF", "LIF", "PLIF"]),
    tau=st.floats(1.05, 5.0),
    decay_input=st.booleans(),
    v_threshold=st.floats(0.1, 2.0),
    v_reset=st.one_of(st.none(), st.just(0.0), st.floats(-1.0, 0.5)),
    detach_reset=st.booleans(),
    surrogate=SURROGATES,
)
REFERENCE_RTOL = 1e-10  # SpikingJelly's float64 values and gradients, normwise relative


def problem_arrays(cfg: F.NeuronConfig, T: int, shape: tuple, dtype, return_v_seq: bool, v_init_ndim, seed: int):
    """``(x, v_init, w, ct_s, ct_v)`` in ``dtype`` for a drawn neuron problem.

    X lies around the threshold so that every example fires and resets a good deal;
    ``v_init`` is None or a state of the trailing shape's last ``v_init_ndim`` dimensions.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(0.6 * cfg.v_threshold, 0.8, (T, *shape)).astype(dtype)
    v_init = None
    if v_init_ndim is not None:
        v_init = (cfg.vr + rng.normal(0.0, 0.5, shape[len(shape) - v_init_ndim:])).astype(dtype)
    w = np.asarray(rng.uniform(-2.0, 2.0), dtype) if cfg.kind == "PLIF" else None
    ct_s = rng.normal(size=(T, *shape)).astype(dtype)
    ct_v = rng.normal(size=(T, *shape) if return_v_seq else shape).astype(dtype)
    return x, v_init, w, ct_s, ct_v


def low_precision_problem(cfg: F.NeuronConfig, shape: tuple, dtype, return_v_seq: bool, seed: int = 0):
    """``(x, v_init, w, ct_s, ct_v)`` for ``dtype`` inputs: ``x``, ``ct_s`` ``[T, ...]`` in ``dtype``; ``v_init [...]``,
    ``w`` and ``ct_v`` (``[T, ...]`` with ``return_v_seq``, else ``[...]``) in the float32 state dtype."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(0.6, 0.8, shape), dtype)
    v_init = jnp.asarray(rng.normal(0.0, 0.5, shape[1:]), jnp.float32)
    w = jnp.asarray(rng.uniform(-1, 1), jnp.float32) if cfg.kind == "PLIF" else None
    ct_s = jnp.asarray(rng.normal(size=shape), dtype)
    ct_v = jnp.asarray(rng.normal(size=shape if return_v_seq else shape[1:]), jnp.float32)
    return x, v_init, w, ct_s, ct_v


def assert_same_run(got, want, *, v_tol: float = 0.0, dx: float, dv_init: float | None = None,
                    dw: float | None = None) -> None:
    """Two ``run_vjp`` results agree: same dtypes and shapes, equal spikes, V within ``v_tol`` (0: bit for bit),
    and the gradients within ``dx``, ``dv_init`` and ``dw`` (these two default to ``dx``), normwise relative."""
    assert jax.tree.structure(got) == jax.tree.structure(want), "a gradient is None in one run only"
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    d = compare.differences(got, want)
    assert d["spike_mismatch"] == 0, f"spikes differ: {d}"
    assert d["v"] <= v_tol, f"v differs: {d}"
    tols = {"dx": dx, "dv_init": dx if dv_init is None else dv_init, "dw": dx if dw is None else dw}
    for name, tol in tols.items():
        assert d.get(name, 0.0) <= tol, f"grad {name}: normwise relative error {d[name]:.3e} > {tol:g} ({d})"


def assert_matches_reference(arrays: dict, spikes, **real) -> None:
    """A run reproduces a SpikingJelly case: ``spikes`` equal ``arrays["spikes"]`` exactly and each named real
    output (``v_seq=...``, ``grad_x=...``) equals ``arrays[name]`` within ``REFERENCE_RTOL``."""
    n_bad = int(np.sum(np.asarray(spikes) != arrays["spikes"]))
    assert n_bad == 0, f"spikes: {n_bad} of {arrays['spikes'].size} differ"
    for name, got in real.items():
        err = compare.rel_error(got, arrays[name])
        assert err <= REFERENCE_RTOL, f"{name}: normwise relative error {err:.3e} > {REFERENCE_RTOL:g}"
