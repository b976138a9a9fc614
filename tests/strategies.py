"""Hypothesis strategies shared by the neuron tests, and the arrays of one drawn problem."""
import numpy as np
from hypothesis import strategies as st

from snnjax.neurons import functional as F
from snnjax.neurons import surrogate as sg

SURROGATES = st.one_of(
    st.builds(sg.Sigmoid, alpha=st.floats(0.5, 8.0)),
    st.builds(sg.ATan, alpha=st.floats(0.5, 8.0)),
    st.builds(sg.PiecewiseQuadratic, alpha=st.floats(0.25, 4.0)),
    st.builds(sg.SoftSign, alpha=st.floats(0.5, 8.0)),
)

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
