"""Interoperability with SpikingJelly.

- ``spikingjelly``: import a SpikingJelly (PyTorch) ``state_dict`` into an snnjax model.
- ``check``: recompute a SpikingJelly reference file (golden outputs and gradients) and
  report how far snnjax is from it; ``python -m snnjax.interop check FILE.npz`` (``__main__``).
"""
