"""Every SpikingJelly 2.0.0 surrogate and the parallel spiking neurons, against SpikingJelly's float64 golden data.

- ``surrogates.*``: each surrogate alone on a grid holding its breakpoints (forward exactly for spikes, the
  gradient, the primitive, SpikingJelly's default keywords) and a LIF with it (``impl="auto"``: the native
  kernels for the five they compute, otherwise the ``xla`` path with a warning that says why); the two
  ``spiking=False`` LIF cases also through the plain-autodiff reference; Pallas (interpreted) on one surrogate
  that only it and ``xla`` run, and its kernels lowered for the GPU with the surrogates whose gradients use
  operations the first five's do not (powers, cosines, reciprocals).
- ``psn.*``: ``PSN``, ``MaskedPSN``, ``SlidingPSN`` outputs and gradients of input, weight and bias.
- Names, keywords and the errors of bad ones; the kernels' refusals; PoissonPass's key; a PSN in ``Sequential``.
"""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import quick_compiles, x64_mode
from flax import nnx
from neuron_checks import assert_matches_reference

import snnjax
from snnjax import layers
from snnjax import neurons as F
from snnjax.interop import check
from snnjax.neurons import surrogate as sg
from snnjax.neurons.compare import rel_error
from snnjax.neurons.kernels import dispatch
from snnjax.neurons.kernels import pallas as P

pytestmark = pytest.mark.usefixtures("x64_module")


@pytest.fixture(scope="module")
def surrogate_reference(reference_dir):
    cases, arrays = check.load(reference_dir / "surrogates.npz")
    with arrays:
        return cases, dict(arrays)


def test_every_spikingjelly_surrogate_is_covered(surrogate_reference):
    cases, _ = surrogate_reference
    named = {c["surrogate"]["name"] for c in cases}
    assert named == set(sg.SURROGATES) and len(sg.SURROGATES) == 19
    lif = {c["surrogate"]["name"] for c in cases if c["kind"] == "LIF"}
    assert lif == set(sg.SURROGATES) - {"poisson_pass"}  # random spikes: the neurons refuse it


def test_surrogates_alone_match_spikingjelly(surrogate_reference):
    cases, arrays = surrogate_reference
    with quick_compiles():
        for i, case in enumerate(cases):
            if case["kind"] == "surrogate":
                result = check.check_surrogate_case(case, check.case_arrays(arrays, f"case{i:03d}/"))
                assert result["ok"], (case["surrogate"], result)


def test_lif_with_each_surrogate_matches_spikingjelly(surrogate_reference):
    """impl='auto' on the CPU: native where it can, else xla with a warning naming the native kernels' reason."""
    cases, arrays = surrogate_reference
    with quick_compiles():
        for i, case in enumerate(cases):
            if case["kind"] != "LIF":
                continue
            a = check.case_arrays(arrays, f"case{i:03d}/")
            cfg = check.neuron_config(case)
            native = dispatch.IMPLEMENTATIONS["native"].unsupported_reason(cfg, a["x"].shape, a["x"].dtype, "cpu")
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                result = check.check_neuron_case(case, a, impl="auto")
            assert result["ok"], (case["surrogate"], result)
            said = [str(w.message) for w in seen if "impl='auto' runs this LIF" in str(w.message)]
            assert (said != []) == (native is not None), (case["surrogate"], said)
            if not cfg.surrogate.spiking:  # real-valued "spikes": the generalised backward against plain autodiff
                ref = jax.jit(lambda x, cfg=cfg: F.multistep_reference(cfg, x, return_v_seq=True))(a["x"])
                assert rel_error(ref[0], a["spikes"]) < 1e-12 and rel_error(ref[1], a["v_seq"]) < 1e-12


def test_pallas_runs_surrogates_the_native_kernels_do_not(surrogate_reference):
    name = "q_pseudo_spike"  # every LIF case passes with --impl pallas too (the checker's command line)
    cases, arrays = surrogate_reference
    i = next(i for i, c in enumerate(cases) if c["kind"] == "LIF" and c["surrogate"]["name"] == name)
    a = check.case_arrays(arrays, f"case{i:03d}/")
    cfg = check.neuron_config(cases[i])
    s, v_seq, gx, _ = check.neuron_outputs(cfg, jnp.asarray(a["x"]), jnp.asarray(a["grad_spikes"]), None,
                                           impl="pallas")
    assert_matches_reference(a, s, v_seq=v_seq, grad_x=gx)


def test_psn_family_matches_spikingjelly(reference_dir):
    cases, arrays = check.load(reference_dir / "psn.npz")
    assert {c["kind"] for c in cases} == {"PSN", "MaskedPSN", "SlidingPSN"}
    results = dict(check.iter_cases(cases, arrays))  # python -m snnjax.interop check's cases
    assert len(results) == 7 and all(r["ok"] for r in results.values()), results


def test_kernels_refuse_what_they_cannot_run_and_auto_says_why():
    x = jnp.ones((4, 3))
    erf = F.NeuronConfig(surrogate=sg.Erf())
    choice = dispatch.choose_impl("auto", erf, x)
    assert choice.impl == "xla" and choice.refused and "native kernels cannot run it" in choice.why
    assert dispatch.choose_impl("auto", F.NeuronConfig(), x).impl == "native"
    assert dispatch.choose_impl("pallas", erf, x).impl == "pallas"  # any surrogate whose forward is the step
    for surrogate in (sg.Sigmoid(spiking=False), sg.MultiLevelSpikeCount(2)):
        with pytest.raises(ValueError, match=r"impl='pallas' cannot run.*does not fire the 0/1 step"):
            dispatch.choose_impl("pallas", F.NeuronConfig(surrogate=surrogate), x)
    with pytest.raises(ValueError, match=r"impl='native' cannot run.*Sigmoid\(alpha=4.0, spiking=False\).*C\+\+"):
        dispatch.choose_impl("native", F.NeuronConfig(surrogate=sg.Sigmoid(spiking=False)), x)


def test_names_keywords_and_their_errors():
    for name, cls in sg.SURROGATES.items():
        built = sg.get(name, max_spike_count=2) if name == "multi_level_spike_count" else sg.get(name)
        assert type(built) is cls and sg.name_of(built) == name
        assert sg.get(name, **sg.params_of(built)) == built
        hash(built)  # a jit-static argument
    assert sg.get("atan", 3.0) == sg.ATan(alpha=3.0) and sg.get("s2nn", 3.0, beta=0.5) == sg.S2NN(3.0, 0.5)
    assert check.parse_surrogate("s2nn") == sg.S2NN() and check.parse_surrogate("rect2") == sg.Rect(alpha=2.0)
    with pytest.raises(ValueError, match=r"'piecewise_leaky_relu'.*takes no \['alpha'\].*'c', 'spiking', 'w'"):
        sg.get("piecewise_leaky_relu", 2.0)
    with pytest.raises(ValueError, match=r"'multi_level_spike_count'.*needs \['max_spike_count'\]"):
        sg.get("multi_level_spike_count")
    with pytest.raises(ValueError, match="SuperSpike has no primitive function"):
        sg.SuperSpike(spiking=False)
    with pytest.raises(ValueError, match="alpha > 1"):
        sg.QPseudoSpike(alpha=1.0)
    with pytest.raises(ValueError, match="integer max_spike_count"):
        sg.MultiLevelSpikeCount(1.5)
    with pytest.raises(ValueError, match="draws random spikes"):
        F.NeuronConfig(surrogate=sg.PoissonPass())
    with pytest.raises(ValueError, match="draws random spikes"):
        F.SlidingPSN(2, surrogate_function=sg.PoissonPass(), step_mode="m")


def test_poisson_pass_takes_a_key():
    p = jnp.asarray([0.0, 0.25, 0.5, 1.0])
    with pytest.raises(ValueError, match=r"pass a JAX key"):
        sg.PoissonPass()(p)
    spikes = sg.PoissonPass()(p, jax.random.key(1))
    assert set(np.unique(spikes)) <= {0.0, 1.0} and spikes[0] == 0 and spikes[-1] == 1
    grad = jax.grad(lambda p: jnp.sum(sg.PoissonPass()(p, jax.random.key(1)) * jnp.arange(4.0)))(p)
    np.testing.assert_array_equal(grad, np.arange(4.0))  # straight through
    assert sg.PoissonPass(spiking=False)(p) is p


def test_psn_in_sequential_and_its_errors():
    rngs = nnx.Rngs(0)
    net = snnjax.Sequential(layers.linear(3, 4, rngs=rngs), F.PSN(T=5, rngs=rngs),
                            layers.linear(4, 2, rngs=rngs), F.SlidingPSN(k=2, step_mode="m"))
    run = nnx.jit(lambda net, x: net(x))
    out = run(net, jnp.ones((5, 2, 3)))
    assert out.shape == (5, 2, 2) and set(np.unique(out)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match=r"PSN\(T=5\) takes inputs of exactly 5 steps, got T=3"):
        run(net, jnp.ones((3, 2, 3)))
    with pytest.raises(ValueError, match=r"MaskedPSN draws its initial weights: pass rngs"):
        F.MaskedPSN(k=2, T=4, step_mode="m")
    with pytest.raises(ValueError, match=r"step_mode='s' \(SpikingJelly's default.*not built.*pass step_mode='m'"):
        F.MaskedPSN(k=2, T=4, rngs=rngs)
    sliding = F.SlidingPSN(k=2)  # single-step by default, as SpikingJelly's
    x = jnp.asarray(np.random.default_rng(1).normal(1.0, 1.0, (4, 3)))
    steps = jnp.stack([sliding(x_t) for x_t in x])
    np.testing.assert_array_equal(steps, F.SlidingPSN(k=2, step_mode="m")(x))
    assert sliding.queue.get_value().shape == (2, 3)
    F.reset_net(snnjax.Sequential(sliding))
    assert sliding.queue.get_value().shape == ()
    masked = F.MaskedPSN(k=2, T=3, lambda_init=0.5, step_mode="m", rngs=rngs)
    masked.lambda_.set_value(jnp.asarray(1.0))  # the user's schedule raises it: W M_k from then on
    np.testing.assert_array_equal(masked.gemm_weight(3), masked.weight[...] * np.tril(np.triu(np.ones((3, 3)), -1)))


def test_psn_weights_import_from_a_spikingjelly_state_dict(reference_dir):
    """SpikingJelly's ``nn.Sequential(PSN, MaskedPSN, SlidingPSN)`` keys, shapes as SpikingJelly's (masks ignored)."""
    rngs = nnx.Rngs(0)
    net = snnjax.Sequential(F.PSN(T=4, rngs=rngs), F.MaskedPSN(k=2, T=4, step_mode="m", rngs=rngs),
                            F.SlidingPSN(k=3, step_mode="m"))
    rng = np.random.default_rng(0)
    sd = {"0.weight": rng.normal(size=(4, 4)), "0.bias": rng.normal(size=(4, 1)), "1.weight": rng.normal(size=(4, 4)),
          "1.bias": rng.normal(size=(4, 1)), "1._lambda_": np.asarray(0.7), "1.mask0": np.tril(np.ones((4, 4))),
          "1.mask1": np.ones((4, 4)), "2.weight": rng.normal(size=3), "2.bias": np.asarray(-0.5)}
    report = snnjax.interop.import_state_dict(net, sd, dtype=jnp.float64)
    assert not report.leftover and sorted(report.ignored) == ["1.mask0", "1.mask1"]
    np.testing.assert_array_equal(net.layers[1].lambda_[...], 0.7)
    np.testing.assert_array_equal(net.layers[2].weight[...], sd["2.weight"])


def test_gradients_keep_the_input_dtype():
    """In one trace, every surrogate's gradient and call on float32 and bfloat16 inputs come back in their dtype."""
    every = [cls(1) if cls is sg.MultiLevelSpikeCount else cls() for cls in sg.SURROGATES.values()
             if cls is not sg.PoissonPass]

    def outputs(x):
        return [(s.grad(x), s(x), s.derivative(x)) for s in every]

    for dtype in (jnp.float32, jnp.bfloat16):
        got = jax.jit(outputs)(jnp.linspace(-2, 2, 9, dtype=dtype))
        assert all(a.dtype == dtype for triple in got for a in triple)


def test_the_pallas_kernels_lower_for_the_gpu_with_the_new_gradients():
    """The Triton lowering of the forward and backward kernels (on this CPU machine) takes the gradients with
    operations the first five surrogates' lack (``pow``, ``cos``, reciprocals, nested selects); the compiled runs
    are ``python -m snnjax.bench.pallas_check``'s."""
    opts = P.KernelOptions(interpret=False)
    x = jax.ShapeDtypeStruct((6, 2, 1000), jnp.float32)
    with x64_mode(False):
        for surrogate in (sg.S2NN(), sg.QPseudoSpike(), sg.SquarewaveFourierSeries(n=3), sg.FakeNumericalGradient(),
                          sg.LogTailedReLU(), sg.NonzeroSignLogAbs()):
            cfg = F.NeuronConfig(kind="LIF", surrogate=surrogate)

            def grads(x, cfg=cfg):
                out, vjp = jax.vjp(functools.partial(P.multistep, cfg, options=opts), x)
                return vjp(jax.tree.map(jnp.ones_like, out))

            hlo = jax.jit(grads).trace(x).lower(lowering_platforms=("cuda",)).as_text()
            assert hlo.count("custom_call @__gpu$xla.gpu.triton") == 2, surrogate
