"""Hypothesis strategies shared by the neuron tests."""
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
