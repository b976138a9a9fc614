"""IF / LIF / PLIF against SpikingJelly 2.0.0 golden data (``../shared/reference/neurons.*``), in float64.

Every case of ``neurons.json`` runs through
- the functional core ``multistep`` (jitted, hand-written custom-vjp backward),
- the Flax NNX modules in multi-step mode (``store_v_seq=True``, PLIF's ``w`` from the file),
- the modules in single-step mode, fed one time step at a time, then ``reset_net``.
Spikes must match exactly; ``v_seq``, ``grad_x`` and PLIF's ``grad_w`` to 1e-10
normwise relative error. The checker reads the json generically: any T, trailing
shape, case list; missing keys take SpikingJelly's defaults.
"""
from __future__ import annotations

import functools
import json
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from snnjax.interop.fixtures import neuron_outputs
from snnjax.neurons import functional as F
from snnjax.neurons import modules as M
from snnjax.neurons import surrogate as sg

RTOL = 1e-10
_REF_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "reference"


def _load_cases() -> list[dict]:
    path = _REF_DIR / "neurons.json"
    if not path.exists():
        return [{}]  # one placeholder case; the reference_dir fixture then fails loudly
    with open(path) as f:
        return json.load(f)


CASES = _load_cases()


def _case_id(i: int, d: dict) -> str:
    if not d:
        return f"case{i:03d}"
    parts = [f"case{i:03d}", d.get("kind", "?")]
    if "tau" in d:
        parts.append(f"tau{d['tau']}")
    if "init_tau" in d:
        parts.append(f"itau{d['init_tau']}")
    if d.get("kind") in ("LIF", "PLIF"):
        parts.append("di" if d.get("decay_input", True) else "nodi")
    v_reset = d.get("v_reset", 0.0)
    parts.append("soft" if v_reset is None else f"hard{v_reset}")
    parts.append("detach" if d.get("detach_reset", False) else "nodetach")
    parts.append(str(d.get("surrogate", "sigmoid4")))
    parts.append(f"th{d.get('v_threshold', 1.0)}")
    return "-".join(parts)


CASE_PARAMS = [pytest.param(i, id=_case_id(i, d)) for i, d in enumerate(CASES)]


pytestmark = pytest.mark.usefixtures("x64_module")


@functools.lru_cache(maxsize=None)
def _npz(ref_dir: pathlib.Path):
    with np.load(ref_dir / "neurons.npz") as z:
        return {k: z[k] for k in z.files}


def _arrays(ref_dir: pathlib.Path, i: int) -> dict[str, np.ndarray]:
    prefix = f"case{i:03d}/"
    arrays = {k[len(prefix):]: v for k, v in _npz(ref_dir).items() if k.startswith(prefix)}
    missing = {"x", "spikes", "v_seq", "grad_spikes", "grad_x"} - set(arrays)
    assert not missing, f"case {i}: arrays {sorted(missing)} missing from neurons.npz"
    return arrays


def _surrogate(name: str) -> sg.Surrogate:
    """``sigmoid4`` -> ``Sigmoid(alpha=4)``, ``atan2`` -> ``ATan(alpha=2)``, ``soft_sign`` -> default alpha."""
    m = re.fullmatch(r"([a-z_]+?)_?(\d+(?:\.\d+)?)?", name)
    assert m, f"cannot parse surrogate name {name!r}"
    alpha = None if m.group(2) is None else float(m.group(2))
    return sg.get(m.group(1), alpha)


def _common_kwargs(d: dict) -> dict:
    return dict(
        v_threshold=float(d.get("v_threshold", 1.0)),
        v_reset=d.get("v_reset", 0.0),
        detach_reset=bool(d.get("detach_reset", False)),
    )


def _config(d: dict) -> F.NeuronConfig:
    kind = d["kind"]
    extra = {}
    if kind == "LIF":
        extra = dict(tau=float(d.get("tau", 2.0)), decay_input=bool(d.get("decay_input", True)))
    elif kind == "PLIF":
        extra = dict(decay_input=bool(d.get("decay_input", True)))
    return F.NeuronConfig(kind=kind, surrogate=_surrogate(d.get("surrogate", "sigmoid4")), **_common_kwargs(d), **extra)


def _plif_w(d: dict, arrays: dict) -> np.ndarray:
    if "w" in arrays:
        return arrays["w"]
    return np.asarray(-math.log(float(d.get("init_tau", 2.0)) - 1.0))


def _node(d: dict, arrays: dict, step_mode: str, store_v_seq: bool = False) -> M.BaseNode:
    kw = dict(_common_kwargs(d), surrogate_function=_surrogate(d.get("surrogate", "sigmoid4")),
              step_mode=step_mode, store_v_seq=store_v_seq)
    kind = d["kind"]
    if kind == "IF":
        return M.IFNode(**kw)
    if kind == "LIF":
        return M.LIFNode(tau=float(d.get("tau", 2.0)), decay_input=bool(d.get("decay_input", True)), **kw)
    if kind == "PLIF":
        node = M.ParametricLIFNode(init_tau=float(d.get("init_tau", 2.0)),
                                   decay_input=bool(d.get("decay_input", True)), **kw)
        node.w.set_value(jnp.asarray(_plif_w(d, arrays), jnp.float64))
        return node
    raise AssertionError(f"unknown kind {kind!r} in neurons.json")


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    denom = max(np.linalg.norm(want), np.linalg.norm(got))
    return 0.0 if denom == 0 else float(np.linalg.norm(got - want) / denom)


def _check(what: str, got, want):
    err = _rel(got, want)
    assert err <= RTOL, f"{what}: normwise relative error {err:.3e} > {RTOL:g}"


def _check_spikes(got, want):
    got = np.asarray(got)
    n_bad = int(np.sum(got != want))
    assert n_bad == 0, f"spikes: {n_bad} of {want.size} differ"


def test_reference_has_cases(reference_dir):
    assert len(CASES) > 0 and CASES[0], "neurons.json lists no cases"
    kinds = {d["kind"] for d in CASES}
    assert kinds <= {"IF", "LIF", "PLIF"}, kinds


@pytest.mark.parametrize("i", CASE_PARAMS)
def test_functional_multistep_matches_spikingjelly(reference_dir, i):
    d, a = CASES[i], _arrays(reference_dir, i)
    cfg = _config(d)
    w = jnp.asarray(_plif_w(d, a)) if d["kind"] == "PLIF" else None
    x = jnp.asarray(a["x"])
    assert x.dtype == jnp.float64
    s, v_seq, gx, gw = neuron_outputs(cfg, x, jnp.asarray(a["grad_spikes"]), w)
    assert s.dtype == v_seq.dtype == gx.dtype == jnp.float64
    _check_spikes(s, a["spikes"])
    _check("v_seq", v_seq, a["v_seq"])
    _check("grad_x", gx, a["grad_x"])
    if d["kind"] == "PLIF" and "grad_w" in a:
        _check("grad_w", gw, a["grad_w"])


@pytest.mark.parametrize("i", CASE_PARAMS)
def test_module_multistep_matches_spikingjelly(reference_dir, i):
    """The NNX module path (config assembly, w parameter, sown v_seq, gradients).

    Runs op by op under ``jax.disable_jit`` (fast: no per-case compilation); the
    compiled path is covered by the functional test above.
    """
    d, a = CASES[i], _arrays(reference_dir, i)
    node = _node(d, a, step_mode="m", store_v_seq=True)
    assert node.config == _config(d)
    gs = jnp.asarray(a["grad_spikes"])

    def loss(m, x):
        s, inter = nnx.capture(m, nnx.Intermediate)(x)
        return jnp.sum(s * gs), (s, inter["v_seq"].get_value())

    with jax.disable_jit():
        (_, (s, v_seq)), (g_state, gx) = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            node, jnp.asarray(a["x"]))
    _check_spikes(s, a["spikes"])
    _check("v_seq", v_seq, a["v_seq"])
    _check("grad_x", gx, a["grad_x"])
    if d["kind"] == "PLIF" and "grad_w" in a:
        _check("grad_w", g_state["w"].get_value(), a["grad_w"])


@pytest.mark.parametrize("i", CASE_PARAMS)
def test_module_single_step_matches_spikingjelly(reference_dir, i):
    d, a = CASES[i], _arrays(reference_dir, i)
    node = _node(d, a, step_mode="s")
    fresh = np.asarray(node.v.get_value())

    def run():
        spikes, vs = [], []
        for t in range(a["x"].shape[0]):
            spikes.append(np.asarray(node(jnp.asarray(a["x"][t]))))
            vs.append(np.asarray(node.v.get_value()))
        return np.stack(spikes), np.stack(vs)

    s1, v1 = run()
    M.reset_net(node)
    v_after = np.asarray(node.v.get_value())
    assert v_after.dtype == fresh.dtype and v_after.shape == fresh.shape
    np.testing.assert_array_equal(v_after, fresh, err_msg="reset_net did not restore the initial state")
    s2, v2 = run()
    np.testing.assert_array_equal(s2, s1, err_msg="a second run after reset_net differs from the first")
    np.testing.assert_array_equal(v2, v1, err_msg="a second run after reset_net differs from the first")

    _check_spikes(s1, a["spikes"])
    _check("v_seq (single-step)", v1, a["v_seq"])


def test_reset_net_resets_every_neuron_in_a_model():
    class Net(nnx.Module):
        def __init__(self):
            self.a = M.IFNode(v_reset=-0.5)
            self.b = M.LIFNode(v_reset=None)
            self.c = M.ParametricLIFNode()

    net = Net()
    fresh = {n: np.asarray(getattr(net, n).v.get_value()) for n in "abc"}
    x = jnp.full((4,), 0.7)
    for _ in range(3):
        net.a(x), net.b(x), net.c(x)
    assert any(not np.array_equal(np.asarray(getattr(net, n).v.get_value()), fresh[n]) for n in "abc")
    M.reset_net(net)
    for n in "abc":
        np.testing.assert_array_equal(np.asarray(getattr(net, n).v.get_value()), fresh[n], err_msg=n)
    assert float(net.a.v.get_value()) == np.float32(-0.5) and float(net.b.v.get_value()) == 0.0


def test_plif_initial_w():
    node = M.ParametricLIFNode(init_tau=3.0)
    np.testing.assert_allclose(float(node.w.get_value()), -math.log(2.0), rtol=1e-6)
    # 1/tau = sigmoid(w) recovers init_tau
    np.testing.assert_allclose(1.0 / float(jax.nn.sigmoid(node.w.get_value())), 3.0, rtol=1e-6)
