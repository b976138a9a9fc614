"""Fused multi-timestep neuron kernels for the CPU: C++ (``neuron_kernels.h``) called through XLA FFI.

``neuron.multistep`` is the entry point (``snnjax.neurons.multistep(..., impl="native")``, and
``impl="auto"`` on a CPU, call it); ``build`` compiles the library for this
machine on first use and caches it.
"""
