"""Compiled-kernel check: the fused kernels against the XLA path on the same (GPU) device.

    python -m snnjax.bench.pallas_check [--out FILE.jsonl] [--shape T N C] [--limit K]

The CPU tests run the kernels in interpret mode; this runs them compiled on the default
backend (a GPU; on a CPU it falls back to interpret mode), over a covering set of variants: every (kind, reset mode,
surrogate) triple of five surrogates, one case for each other surrogate whose forward is the step, with
detach_reset, decay_input, ``return_v_seq``, custom thresholds / reset potentials, random ``v_init`` rotating
through them, in float32 and (every other case) bfloat16, on a shape whose M is not a multiple of any block
(partial last block).
Then the kernels generated from a neuron's single step (``pallas.step``; what ``impl="auto"`` runs on a GPU for
every neuron given by its step): a LIF written as a user writes one (hard and soft reset) and each recurrent
catalogue neuron with scalar parameters, float32, against the ``scan`` path on the same device (outputs, final
state, the VJP w.r.t. ``x`` and every learnable parameter).
Per case it compares spikes (exactly equal fraction), V, and the VJP w.r.t. ``x``,
``v_init`` and PLIF's ``w`` (normwise relative error, ``snnjax.neurons.compare``) with the XLA path
run on the same device, prints one line (and one JSON record with ``--out``), and exits 1
if any case exceeds the tolerances: at most 1e-4 of the spikes differ (the GPU compilers
may contract a multiply-add differently, which can move a value sitting exactly on the
threshold), gradients within 1e-4 (float32) / 2e-2 (bfloat16).
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax import neurons
from snnjax.neurons import base as B
from snnjax.neurons import surrogate as sg
from snnjax.neurons.compare import differences, rel_error, run_vjp
from snnjax.neurons.kernels import pallas as P

SURROGATES = [sg.Sigmoid(), sg.ATan(), sg.PiecewiseQuadratic(), sg.SoftSign(alpha=3.0), sg.Rect(alpha=2.0)]
# The other surrogates whose forward is the step (the kernels trace their ``grad``): one case each.
MORE_SURROGATES = [sg.PiecewiseExp(), sg.SuperSpike(), sg.NonzeroSignLogAbs(), sg.Erf(), sg.PiecewiseLeakyReLU(),
                   sg.SquarewaveFourierSeries(n=4), sg.S2NN(), sg.QPseudoSpike(alpha=2.5), sg.LeakyKReLU(leak=0.1),
                   sg.FakeNumericalGradient(), sg.LogTailedReLU(alpha=0.05), sg.DeterministicPass()]
SHAPE = (6, 5, 1003)  # M = 5015: several blocks, the last partial, at every power-of-two block size
MAX_SPIKE_MISMATCH = 1e-4
GRAD_TOL = {"float32": 1e-4, "bfloat16": 2e-2}


def cases():
    """``(cfg, dtype, return_v_seq, random_v_init)`` covering every kind x reset x surrogate of ``SURROGATES``, then
    one case for each of ``MORE_SURROGATES`` (kinds and resets rotating)."""
    grid = list(itertools.product(["IF", "LIF", "PLIF"], ["hard", "soft"], SURROGATES))
    more = [(["IF", "LIF", "PLIF"][j % 3], ["hard", "soft"][j % 2], s) for j, s in enumerate(MORE_SURROGATES)]
    for i, (kind, reset, surrogate) in enumerate(grid + more):
        v_reset = None if reset == "soft" else (0.0 if i % 3 else -0.2)
        cfg = B.NeuronConfig(kind=kind, tau=1.5 + 0.5 * (i % 3), decay_input=i % 2 == 0,
                             v_threshold=1.0 if i % 4 else 0.7, v_reset=v_reset, detach_reset=(i // 2) % 2 == 1,
                             surrogate=surrogate)
        for dtype in (["float32", "bfloat16"] if i % 2 == 0 else ["float32"]):
            yield cfg, dtype, i % 3 == 1, i % 4 != 0


def check_case(cfg, dtype, return_v_seq, random_v_init, opts, seed, shape=SHAPE) -> dict:
    rng = np.random.default_rng(seed)
    dt = jnp.dtype(dtype)
    x = jnp.asarray(rng.normal(0.6 * cfg.v_threshold, 0.8, shape), dt)
    v_init = jnp.asarray(cfg.vr + rng.normal(0, 0.5, shape[1:]) if random_v_init else np.full(shape[1:], cfg.vr),
                         jnp.float32)
    w = jnp.asarray(rng.uniform(-1, 1), jnp.float32) if cfg.kind == "PLIF" else None
    ct_s = jnp.asarray(rng.normal(size=shape), dt)
    ct_v = jnp.asarray(rng.normal(size=shape if return_v_seq else shape[1:]), jnp.float32)
    args = (cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    got, want = run_vjp(functools.partial(P.multistep, options=opts), *args), run_vjp("xla", *args)
    (_, v_p), g_p = got
    rec = {**differences(got, want), "fire_rate": float(np.mean(np.asarray(want[0][0], np.float32))),
           "finite": all(bool(np.isfinite(np.asarray(a, np.float32)).all()) for a in (v_p, *g_p) if a is not None)}
    tol = GRAD_TOL[dtype]
    rec["ok"] = (rec["finite"] and rec["spike_mismatch"] <= MAX_SPIKE_MISMATCH and rec["v"] <= tol
                 and all(rec[k] <= tol for k in ("dx", "dv_init", "dw") if k in rec))
    return rec


def step_cases():
    """``(label, make)`` for the kernels generated from a step: ``make(impl)`` builds the multi-step module."""
    from snnjax.bench.neuron import user_lif

    user = user_lif()
    c = neurons
    yield "UserLIF hard", lambda impl: user(tau=2.0, step_mode="m", impl=impl)
    yield "UserLIF soft detach", lambda impl: user(tau=1.5, v_reset=None, detach_reset=True, step_mode="m",
                                                   impl=impl)
    for cls, kw in [(c.CUBALIFNode, {}), (c.NonSpikingLIFNode, {}), (c.QIFNode, {}), (c.EIFNode, {}),
                    (c.KLIFNode, {"scale_reset": True}), (c.IzhikevichNode, {"a": 0.3, "b": 0.2}),
                    (c.TernaryLIFNode, {}), (c.LIAFNode, {"act": jax.nn.relu, "threshold_related": True}),
                    (c.HalfThresholdIFNode, {}), (c.RAFNode, {}), (c.ComplementaryLIFNode, {}), (c.ILIFNode, {})]:
        yield cls.__name__, lambda impl, cls=cls, kw=kw: cls(step_mode="m", impl=impl, **kw)


def check_step_case(make, seed, shape=SHAPE) -> dict:
    """The generated Pallas kernels against ``scan`` for one step neuron, float32: ``spike_mismatch`` (the
    fraction of outputs that differ), ``state`` / ``dx`` / ``dparams`` (``rel_error``, the worst leaf)."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(0.6, 0.8, shape), jnp.float32)
    ct_s = jnp.asarray(rng.normal(size=shape), jnp.float32)

    def run_impl(impl):
        graphdef, params, rest = nnx.split(make(impl), nnx.Param, ...)

        def run(x, params):
            out, final = nnx.merge(graphdef, params, rest).multi_step(x)
            return out, final

        (out, final), vjp = jax.vjp(run, x, params)
        dx, dp = vjp((ct_s, jax.tree.map(lambda a: 0.5 * jnp.cos(a), final)))
        return out, jax.tree.leaves(final), dx, jax.tree.leaves(dp)

    run_impl = jax.jit(run_impl, static_argnums=0)
    (out, final, dx, dp), (out_w, final_w, dx_w, dp_w) = run_impl("pallas"), run_impl("scan")
    worst = lambda a, b: max([rel_error(g, w) for g, w in zip(a, b, strict=True)], default=0.0)  # noqa: E731
    rec = {"spike_mismatch": float(np.mean(np.asarray(out) != np.asarray(out_w))), "state": worst(final, final_w),
           "dx": rel_error(dx, dx_w), "dparams": worst(dp, dp_w),
           "fire_rate": float(np.mean(np.asarray(out_w) != 0)),
           "finite": all(bool(np.isfinite(np.asarray(a)).all()) for a in (out, *final, dx, *dp))}
    tol = GRAD_TOL["float32"]
    rec["ok"] = (rec["finite"] and rec["spike_mismatch"] <= MAX_SPIKE_MISMATCH
                 and all(rec[k] <= tol for k in ("state", "dx", "dparams")))
    return rec


def run_checks(chosen, check, device) -> tuple[list[dict], int]:
    """Run ``check(case, n)`` for each ``(n, label, case)``, printing a line and building a record for each."""
    records, failed = [], 0
    for n, label, case in chosen:
        start = time.perf_counter()
        try:
            rec = check(case, n)
        except Exception as e:  # noqa: BLE001 (report every variant's failure, then exit 1)
            rec = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]!r}"}
        rec.update(case=label.split(), seconds=time.perf_counter() - start,
                   device_kind=device.device_kind, jax_version=jax.__version__)
        failed += not rec["ok"]
        print(f"{'ok  ' if rec['ok'] else 'FAIL'} {label} " + " ".join(
            f"{k}={rec[k]:.2e}" for k in ("spike_mismatch", "v", "state", "dx", "dv_init", "dw", "dparams")
            if k in rec) + (f" {rec['error']}" if "error" in rec else ""), flush=True)
        records.append(rec)
    return records, failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="append one JSON line per case to this file")
    p.add_argument("--shape", type=int, nargs=3, default=SHAPE, metavar=("T", "N", "C"),
                   help=f"input shape (default {' '.join(map(str, SHAPE))})")
    p.add_argument("--limit", type=int, help="check only every k-th case, k chosen to leave at most LIMIT cases")
    args = p.parse_args(argv)
    device = jax.devices()[0]
    shape = tuple(args.shape)
    print(f"fused kernels vs XLA path on {device.platform} ({device.device_kind}), jax {jax.__version__}, "
          f"shape {shape}", flush=True)
    opts = P.DEFAULT  # compiled on a GPU, interpreted on a CPU
    chosen = list(enumerate(cases()))
    steps = list(enumerate(step_cases()))
    if args.limit:
        chosen = chosen[::-(-len(chosen) // args.limit)]
        steps = steps[::-(-len(steps) // args.limit)]

    def label(cfg, dtype, return_v_seq):
        return (f"{cfg.kind:<4} {'soft' if cfg.v_reset is None else 'hard'} "
                f"{'detach' if cfg.detach_reset else '      '} {'di' if cfg.decay_input else '  '} "
                f"{type(cfg.surrogate).__name__:<18} {dtype:<8} {'vseq' if return_v_seq else '    '}")

    records, failed = run_checks(
        [(n, label(cfg, dtype, seq), (cfg, dtype, seq, rv)) for n, (cfg, dtype, seq, rv) in chosen],
        lambda case, n: check_case(*case, opts, seed=n, shape=shape), device)
    print(f"kernels generated from a step vs the scan path, float32, shape {shape}", flush=True)
    more, more_failed = run_checks([(n, f"step {name}", make) for n, (name, make) in steps],
                                   lambda make, n: check_step_case(make, seed=n, shape=shape), device)
    records, failed = records + more, failed + more_failed
    if args.out:
        with open(args.out, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    print(json.dumps({"cases": len(records), "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
