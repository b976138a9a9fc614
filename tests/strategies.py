"""Hypothesis strategies shared by the neuron tests."""
from hypothesis import strategies as st

from snnjax.neurons import surrogate as sg

SURROGATES = st.one_of(
    st.builds(sg.Sigmoid, alpha=st.floats(0.5, 8.0)),
    st.builds(sg.ATan, alpha=st.floats(0.5, 8.0)),
    st.builds(sg.PiecewiseQuadratic, alpha=st.floats(0.25, 4.0)),
    st.builds(sg.SoftSign, alpha=st.floats(0.5, 8.0)),
)
