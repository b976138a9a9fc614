"""spyx's side of ``snnjax.bench.peers`` (JAX in its own interpreter: spyx 1.0 pins its own jax and flax).

    /path/to/spyx-venv/bin/python snnjax/bench/peers_spyx.py

A peer (``snnjax.bench.peer``) that builds the benchmark as spyx's documentation writes a model:
``spyx.nn.Sequential(nnx.Linear | nnx.Conv, spyx.nn.LIF)`` run over time-major ``[T, B, ...]`` by
``spyx.nn.run`` (a ``lax.scan`` of the layer and the neuron per step), loss = the spike sum, its gradient with
respect to the parameters and the input jitted together. Requests as ``peers_torch`` (``setup`` with
``workload.peer_problem``'s weights and input, ``time``).

spyx's ``LIF`` is not SpikingJelly's: it reads its spike from the previous step's potential (one step late) and
subtracts the threshold after the decay (``V = beta V + x - S th``), so no SpikingJelly LIF computes it; it gets
``beta = 1 - 1/tau``, the threshold, and the ``tanh(k=alpha / 2)`` surrogate, whose gradient
``sech(2 x)^2`` equals Sigmoid(4)'s, and is timed but not checked. Never imports snnjax.
"""
from __future__ import annotations

import argparse
import importlib.metadata

import numpy as np

if __package__:  # imported as snnjax.bench.peers_spyx
    from snnjax.bench import peer, workload
else:  # run as a script: its folder is sys.path[0], and the snnjax package stays out
    import peer
    import workload


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--keep-freed-memory", action="store_true", help="snnjax.runtime.hostmem.keep_freed_memory() first")
    args = p.parse_args(argv)
    if args.keep_freed_memory:
        peer.keep_freed_memory()

    import jax
    import jax.numpy as jnp
    import spyx
    from flax import nnx

    held = {}

    def setup(request: dict) -> dict:
        held.clear()
        conv, n = request["workload"] == "conv", request["N"]
        problem = workload.peer_problem(request["workload"], request["T"], request["B"], n, request["image_size"])
        neuron = request["neuron"]
        rngs = nnx.Rngs(0)
        layer = (nnx.Conv(n, n, (3, 3), padding=1, rngs=rngs) if conv else nnx.Linear(n, n, rngs=rngs))
        layer.kernel[...] = jnp.asarray(problem["kernel"])
        layer.bias[...] = jnp.asarray(problem["bias"])
        shape = problem["x"].shape[2:]
        model = spyx.nn.Sequential(layer, spyx.nn.LIF(shape, beta=1.0 - 1.0 / neuron["tau"],
                                                      threshold=neuron["v_threshold"],
                                                      activation=spyx.axn.tanh(k=neuron["sigmoid_alpha"] / 2),
                                                      rngs=rngs))
        graphdef, params = nnx.split(model)

        def loss(params, x):
            spikes = spyx.nn.run(nnx.merge(graphdef, params), x)[0]
            return jnp.sum(spikes), spikes

        step = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
        x = jnp.asarray(problem["x"])
        for _ in range(max(args.warmup, 1)):
            (grads, x_grad), spikes = jax.block_until_ready(step(params, x))
        held.update(step=step, params=params, x=x)
        if request.get("dump"):
            np.savez(request["dump"], spikes=np.asarray(spikes).astype(np.uint8),
                     kernel_grad=np.asarray(grads["layers"][0]["kernel"][...]), x_grad=np.asarray(x_grad))
        return {"spikes": float(np.sum(np.asarray(spikes, np.float64)))}

    def timed(_request: dict) -> dict:
        return {"ms": peer.timed_ms(lambda: jax.block_until_ready(held["step"](held["params"], held["x"])))}

    ready = {"library": "spyx", "version": importlib.metadata.version("spyx"), "jax_version": jax.__version__,
             "flax_version": importlib.metadata.version("flax"), "device_kind": jax.devices()[0].device_kind,
             "threads": peer.thread_info()}
    peer.serve({"setup": setup, "time": timed}, ready)


if __name__ == "__main__":
    main()
