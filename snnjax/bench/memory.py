"""Peak memory (compiled) and step time of a train step under each checkpoint policy and spike storage, and of
the online methods (``--methods bptt,ottt``: OTTT / SLTT, one time step at a time, ``snnjax.train.online``).

    python -m snnjax.bench.memory --model spikformer --T 8 --batch-size 4 --image-size 224 \\
        [--plans none:float,none:bits,spikes:bits] [--steps 2] [--budget-mb 1300] [--out FILE.jsonl]
    python -m snnjax.bench.memory --model ottt_vgg --widths 8,16,A,32,32,A,64,64,A,64,64 --T 64 \\
        --methods bptt,ottt --plans none:float,units:float --steps 0

``ottt_vgg`` is SpikingJelly's OTTT VGG (``OTTTSpikingVGG``) on CIFAR10-DVS-sized frames, ``--widths`` its ``cfg``
(default ``8,16,A,32,32,A,64,64,A,64,64``). ``cifar10dvs_vgg`` takes ``--widths`` too (default: its own): a width
per block, ``A`` before a block that average-pools first. With ``--methods`` naming ``ottt`` or ``sltt`` either
VGG is built with ``OTTTLIFNode`` for ``ottt``, ``SLTTLIFNode`` for ``sltt`` and, for ``bptt``, ``LIFNode`` (the
fused kernels), all with OTTT's keywords (tau 2, no decay_input, soft reset, detach_reset). An online method runs
the ``none:float`` plan only (checkpointing plans are for BPTT).

One JSON line per plan: peak bytes per device from the compiled step's ``memory_analysis()``
(arguments + non-aliased outputs + temporaries; exact for the program XLA built), flops from
``cost_analysis()``, the median step time over ``--steps`` runs (0: compile only), and the peak
relative to ``none:float``. With ``--budget-mb`` a last line records the memory search
(``snnjax.train.memory_search``): its choice, its peak and ``optimize_ms``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from snnjax.bench.common import append_jsonl, git_commit

DEFAULT_PLANS = "none:float,none:int8,none:bits,dots_saveable:bits,units:float,units:bits,spikes:float,spikes:bits"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m snnjax.bench.memory")
    ap.add_argument("--model", default="cifar10dvs_vgg", choices=["cifar10dvs_vgg", "spikformer", "mlp", "ottt_vgg"])
    ap.add_argument("--widths", default=None, help="ottt_vgg's cfg (widths and A / M; default 8,16,A,32,32,A,64,64,"
                    "A,64,64) or cifar10dvs_vgg's blocks (widths, A before a pooling block; default its own)")
    ap.add_argument("--methods", default="bptt", help="comma-separated training methods: bptt, ottt, sltt")
    ap.add_argument("--T", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=None, help="default: 48 (VGG, MLP), 224 (Spikformer)")
    ap.add_argument("--plans", default=DEFAULT_PLANS, help="comma-separated policy:storage pairs")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per plan after one warm-up (0: compile only)")
    ap.add_argument("--budget-mb", type=float, default=None, help="also run the memory search for this budget")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file too")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from snnjax.models import create_model, remat
    from snnjax.train import memory_search as ms
    from snnjax.train.step import StepConfig, TrainState, split_model

    size = args.image_size or (224 if args.model == "spikformer" else 48)
    channels = {"spikformer": 3, "cifar10dvs_vgg": 2, "mlp": 2, "ottt_vgg": 2}[args.model]
    widths = args.widths or ("8,16,A,32,32,A,64,64,A,64,64" if args.model == "ottt_vgg" else None)
    vgg_cfg = tuple(int(w) if w.isdigit() else w for w in widths.split(",")) if widths else ()
    blocks = {"widths": tuple(w for w in vgg_cfg if w != "A"),
              "pools": tuple(i > 0 and vgg_cfg[i - 1] == "A" for i, w in enumerate(vgg_cfg) if w != "A")}
    kwargs = {"spikformer": dict(T=args.T, img_size_h=size,
                                 img_size_w=size, in_channels=3, num_classes=1000, embed_dims=256,
                                 num_heads=8, depths=4),
              "cifar10dvs_vgg": dict(image_size=size, in_channels=2, num_classes=10, **(blocks if widths else {})),
              "mlp": dict(in_features=size * size * 2, hidden=(1024, 1024), num_classes=10),
              "ottt_vgg": dict(cfg=vgg_cfg, in_channels=2, num_classes=10)}[args.model]
    name = "ottt_spiking_vggws" if args.model == "ottt_vgg" else args.model
    shape = (args.T, args.batch_size, size, size, channels)
    tx = optax.adam(1e-3)

    def model_kwargs(method: str) -> dict:
        online_run = args.methods != "bptt"
        if args.model != "ottt_vgg" and not (args.model == "cifar10dvs_vgg" and online_run):
            return kwargs
        neuron = {"bptt": "LIF", "ottt": "OTTTLIFNode", "sltt": "SLTTLIFNode"}[method]
        return {**kwargs, "spiking_neuron": neuron, "tau": 2.0, "decay_input": False, "v_reset": None,
                "detach_reset": True}

    abstract = nnx.eval_shape(lambda: create_model(name, model_kwargs("bptt"), rngs=nnx.Rngs(params=0, dropout=1)))
    batch_spec = {"inputs": jax.ShapeDtypeStruct(shape, jnp.float32),
                  "labels": jax.ShapeDtypeStruct((args.batch_size,), jnp.int32)}
    rng = np.random.default_rng(0)
    batch = {"inputs": jnp.asarray((rng.random(shape) < 0.3).astype(np.float32) * 2.0),
             "labels": jnp.asarray(rng.integers(0, 10, args.batch_size), jnp.int32)}
    base = {"model": args.model, **({"widths": widths} if widths else {}), "T": args.T,
            "batch_size": args.batch_size, "image_size": size,
            "device": jax.devices()[0].device_kind, "backend": jax.default_backend(), "commit": git_commit()}
    records, none_peak = [], None
    runs = [(method, item) for method in args.methods.split(",") for item in args.plans.split(",")
            if method == "bptt" or item in ("none", "none:float")]
    for method, item in runs:
        cfg = StepConfig(seed=0, time_steps=args.T, encoder=None, method=method)
        built = nnx.eval_shape(lambda m=method: create_model(name, model_kwargs(m), rngs=nnx.Rngs(params=0, dropout=1)))
        compile_for = ms.step_compiler(built, cfg, tx, batch_spec, analysis_only=False)
        policy, _, storage = item.partition(":")
        candidate = ms.Candidate(remat.settings(policy, storage or "float"))
        m = ms.measure(compile_for, candidate)
        step_ms = None
        if args.steps > 0:
            model = create_model(name, model_kwargs(method), rngs=nnx.Rngs(params=0, dropout=1))
            remat.configure(model, candidate.settings)
            graphdef, params, rngs, rest = split_model(model)
            state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                               opt_state=tx.init(params))
            compiled = compile_for(candidate)
            state, _ = jax.block_until_ready(compiled(state, batch))
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                state, _ = jax.block_until_ready(compiled(state, batch))
                times.append((time.perf_counter() - t0) * 1e3)
            step_ms = statistics.median(times)
            del state, compiled
        if candidate.settings == remat.NONE and method == "bptt":
            none_peak = m.peak_bytes
        rec = {**base, "method": method, "policy": policy, "spike_residuals": storage or "float",
               "peak_bytes": m.peak_bytes,
               "temp_bytes": m.temp_bytes, "gflops": round(m.flops / 1e9, 2), "compile_s": round(m.compile_s, 2),
               "step_ms": None if step_ms is None else round(step_ms, 1), "steps": args.steps,
               "below_none_pct": None if none_peak is None else round(100 * (1 - m.peak_bytes / none_peak), 1)}
        print(rec, flush=True)
        append_jsonl(args.out, rec)
        records.append(rec)
    if args.budget_mb is not None:
        cfg = StepConfig(seed=0, time_steps=args.T, encoder=None)
        result = ms.search_model(abstract, cfg, tx, batch_spec, int(args.budget_mb * 2**20))
        print(result.summary(), flush=True)
        chosen = result.chosen
        rec = {**base, "search": True, "budget_bytes": result.budget_bytes, "optimize_ms": round(result.optimize_ms),
               "compile_ms": round(result.compile_ms), "choose_ms": round(result.optimize_ms - result.compile_ms),
               "chosen": chosen.candidate.describe() if chosen else None,
               "chosen_peak_bytes": chosen.peak_bytes if chosen else None,
               "chosen_estimate_bytes": chosen.estimate_bytes if chosen else None,
               "candidates": result.num_candidates, "candidates_compiled": len(result.tried),
               "calibration": round(result.calibration, 3)}
        print(rec, flush=True)
        append_jsonl(args.out, rec)
        records.append(rec)
    return records


if __name__ == "__main__":
    main()
    sys.exit(0)
