"""The C++ build the native CPU libraries share (``build``: compile, cache, load, register FFI handlers) and their
common header (``parallel_chunks.h``: work chunks on XLA's intra-op thread pool)."""
