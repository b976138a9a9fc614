"""Fused multi-timestep IF / LIF / PLIF kernels in Pallas (forward and backward).

``multistep`` is the entry point (``snnjax.neurons.multistep(..., impl="pallas")`` calls it);
``KernelOptions`` holds the GPU-facing choices (block sizes, Triton launch parameters,
interpret mode). The pure-JAX reference is the XLA path, ``snnjax.neurons.kernels.xla``.
Layout: ``api`` (custom_vjp, flattening, what is stored), ``forward`` and ``backward``
(one kernel each), ``lanes`` (masked rows), ``options``. ``python -m snnjax.bench.pallas_check`` runs the
compiled kernels against the XLA path on a GPU.
"""
from snnjax.neurons.kernels.pallas.api import multistep, unsupported_reason
from snnjax.neurons.kernels.pallas.options import DEFAULT, KernelOptions

__all__ = ["DEFAULT", "KernelOptions", "multistep", "unsupported_reason"]
