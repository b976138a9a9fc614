"""Interoperability with SpikingJelly.

- ``layers``: the converters, per-layer rules and importer of a SpikingJelly (PyTorch) ``state_dict``; imports
  into any model built from snnjax's layers and neurons (``snnjax.Sequential`` or your own), with a report.
- ``rules``: the zoo's rule tables, one per model family; ``spikingjelly``: import through them into the zoo
  models (VGG, Spikformer, ResNets, parametric-LIF nets, Spike-Driven Transformer, QKFormer).
- ``check``: recompute a SpikingJelly reference file (golden outputs and gradients) and
  report how far snnjax is from it; ``python -m snnjax.interop check FILE.npz`` (``__main__``).
"""
