"""snnjax: spiking neural networks in JAX."""
