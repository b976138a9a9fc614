"""Interoperability with SpikingJelly: weight import and reference-file checks."""
