"""Interoperability with SpikingJelly.

- ``layers``: import a SpikingJelly (PyTorch) ``state_dict`` into any model built from snnjax's layers and
  neurons (``snnjax.Sequential`` or your own), layer by layer through a table of per-layer rules, with a report.
- ``spikingjelly``: import a SpikingJelly (PyTorch) ``state_dict`` into the zoo models (VGG, Spikformer).
- ``check``: recompute a SpikingJelly reference file (golden outputs and gradients) and
  report how far snnjax is from it; ``python -m snnjax.interop check FILE.npz`` (``__main__``).
"""
