"""Fused multi-timestep neuron kernels for the CPU: C++ (``neuron_kernels.h``) called through XLA FFI.

``neuron.multistep`` is the entry point (``functional.multistep(..., impl="native")``, and
``impl="auto"`` on one CPU device, call it); ``build`` compiles the library for this
machine on first use and caches it.
"""
