"""The multi-step neuron op (any neuron over ``[T, ...]``, forward and backward) and its implementations.

``dispatch`` holds the table of implementations and ``auto``'s choice (``snnjax.neurons.multistep`` is its entry);
beside it, one module or folder per implementation:

- ``xla``: the pure-JAX reference, a ``lax.scan`` with a hand-written reverse recurrence (``custom_vjp``);
- ``scan``: any neuron's single step (``base.StepNeuron``, or IF / LIF / PLIF's ``base.step``) under ``lax.scan``,
  the backward from the step's VJP;
- ``native``: fused kernels for the CPU in C++ through XLA FFI, compiled on first use: hand-written for IF / LIF /
  PLIF, generated from the step (``native.codegen``) for any other neuron;
- ``pallas``: fused kernels for the GPU in Pallas (run on the CPU with ``interpret=True`` in tests), with the
  step traced into them (``pallas.step``) for any other neuron;
- ``assoc``: a neuron that declares its step a linear recurrence without reset (``base.StepNeuron.linear``) by
  ``lax.associative_scan`` over time, the backward the reverse recurrence;
- ``sharded``: any kernel under a multi-device layout (each device its shard of neurons);
- ``temporal``: the time axis split over devices (the potential passed between them).

Every implementation imports only ``snnjax.neurons.base`` and ``surrogate`` (the equations), so each is checked
against the reference alone (``snnjax.neurons.compare``).
"""
