"""After training: a run's model restored for inference, ops chains, streaming, prediction helpers."""
