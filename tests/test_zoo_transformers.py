"""Spike-Driven Transformer and QKFormer: SpikingJelly's architectures, weight import, golden data.

- The presets have SpikingJelly's parameter and BatchNorm-statistic counts (counted from
  SpikingJelly 2.0.0's ``sdt_8_384()`` and ``qkformer_10_384()``).
- ``snnjax.interop.spikingjelly`` (the rule tables): every key of each shipped case lands on a variable, the
  gradients cover every parameter, and a checkpoint of another architecture, width, depth or
  neuron stops with an error naming the key.
- ``tests/fixtures/spikingjelly/transformers.npz`` (``make_reference_transformers.py``): eval and
  train logits, loss, every gradient and the BatchNorm statistics after a step, every case with the
  neurons on ``xla``, and on ``native`` one case per architecture and neuron kind (SDT with LIF,
  QKFormer with PLIF; ``tests/test_neuron_impls.py`` compares the implementations on every neuron case). The
  suite runs each case once (``GOLDEN``); ``SNNJAX_ALL_CASES=1`` each on ``xla`` too.

Programs compile with ``conftest.quick_compiles``.
"""
from __future__ import annotations

import functools
import math
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import suite_cases

from snnjax.interop import check
from snnjax.interop.spikingjelly import convert_state_dict, import_state_dict
from snnjax.models import QKFormer, SpikeDrivenTransformer, qkformer_10_384, sdt_8_384

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "spikingjelly" / "transformers.npz"
CASES = ("sdt", "sdt_events", "qkformer", "qkformer_plif")
# the suite: each case once, each implementation twice (SNNJAX_ALL_CASES=1: xla for every case too)
GOLDEN = suite_cases([(name, "xla") for name in CASES] + [("sdt_events", "native"), ("qkformer_plif", "native")],
                     [("sdt", "xla"), ("qkformer", "xla"), ("sdt_events", "native"), ("qkformer_plif", "native")])


pytestmark = pytest.mark.usefixtures("quick_compiles_module")


@functools.cache
def _fixture():
    cases, arrays = check.load(FIXTURE)
    return cases, {k: arrays[k] for k in arrays.files}


def _case(name):
    cases, arrays = _fixture()
    return cases[name], check.case_arrays(arrays, f"{name}/")


def _counts(model):
    def n(kind):
        return sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(model, kind)))
    return n(nnx.Param), n(nnx.BatchStat)


@pytest.mark.parametrize("preset,params,stats", [(sdt_8_384, 16816744, 57504), (qkformer_10_384, 16472584, 60192)])
def test_presets_have_spikingjelly_sizes(preset, params, stats):
    model = nnx.eval_shape(lambda: preset(num_classes=1000, rngs=nnx.Rngs(0)))
    assert _counts(model) == (params, stats)


def _abstract(cls, **kw):
    """``cls(**kw)`` with shapes only (no parameter values computed)."""
    return nnx.eval_shape(lambda: cls(**kw, rngs=nnx.Rngs(0)))


def test_shapes_units_and_bad_options():
    m = _abstract(SpikeDrivenTransformer, T=2, in_channels=2, num_classes=5, embed_dims=16, num_heads=2, depths=1,
                  pooling_stat="1100")
    assert [u.name for u in m.units()] == ["stages.0", "stages.1", "stages.2", "final", "blocks.0", "head"]
    assert nnx.eval_shape(lambda m, x: m(x), m, jax.ShapeDtypeStruct((2, 3, 16, 16, 2), np.float32)).shape == (2, 3, 5)
    q = _abstract(QKFormer, T=2, embed_dims=16, num_heads=(1, 2, 2), depths=(1, 2, 1), num_classes=5)
    assert [u.name for u in q.units()] == ["patch_embed1", "stage1.0", "patch_embed2", "stage2.0", "stage2.1",
                                            "patch_embed3", "stage3.0", "head"]
    assert nnx.eval_shape(lambda m, x: m(x), q, jax.ShapeDtypeStruct((3, 32, 32, 3), np.float32)).shape == (2, 3, 5)
    with pytest.raises(ValueError, match="pooling_stat"):
        SpikeDrivenTransformer(pooling_stat="111", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="num_heads"):
        SpikeDrivenTransformer(embed_dims=32, num_heads=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="qka_type"):
        _abstract(QKFormer, embed_dims=16, num_heads=(1, 1, 1), qka_type="spatial")
    with pytest.raises(ValueError, match="spiking_neuron"):
        _abstract(QKFormer, embed_dims=16, num_heads=(1, 1, 1), spiking_neuron="ALIF")


@pytest.mark.parametrize("name", ["sdt", "sdt_events", "qkformer", "qkformer_plif"])
def test_rule_tables_account_for_every_key(name):
    meta, arrays = _case(name)
    model = nnx.eval_shape(lambda: check.build_model(meta, arrays)[0])  # variables abstract: the import fills them
    init = check.case_arrays(arrays, "init/")
    import_state_dict(model, init)  # every variable given, every key placed
    grads = convert_state_dict(model, check.case_arrays(arrays, "grad/"))
    params = {p for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert set(grads) == params
    stats = [k for k in init if not k.endswith("num_batches_tracked")]
    assert len(convert_state_dict(model, init)) == len(stats)


def test_import_errors_name_the_problem():
    meta, arrays = _case("sdt")
    init = check.case_arrays(arrays, "init/")
    opts = dict(meta["options"], T=2, num_classes=10)

    def sdt(**kw):
        return _abstract(SpikeDrivenTransformer, **{**opts, **kw})

    with pytest.raises(ValueError, match="another width"):
        import_state_dict(sdt(embed_dims=64), init)
    with pytest.raises(KeyError, match="does not have"):  # the checkpoint has 2 blocks
        import_state_dict(sdt(depths=1), init)
    with pytest.raises(KeyError, match="does not provide"):
        import_state_dict(sdt(depths=3), init)
    with pytest.raises(KeyError, match="no counterpart in QKFormer"):
        import_state_dict(_abstract(QKFormer, embed_dims=32, num_heads=(2, 2, 4)), init)
    with pytest.raises(KeyError, match="PLIF"):  # LIF checkpoint into PLIF model: w missing
        import_state_dict(sdt(spiking_neuron="PLIF"), init)
    with pytest.raises(KeyError, match="no counterpart in Linear"):  # not a zoo model: located layer by layer
        import_state_dict(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), init)


@pytest.mark.parametrize("name,impl", GOLDEN)
def test_transformers_match_spikingjelly(name, impl, x64):
    """Eval/train logits, loss, every parameter gradient, BN statistics after the step."""
    cases, arrays = _fixture()
    assert set(cases) == set(CASES)
    r = check.check_model_case(cases[name], check.case_arrays(arrays, f"{name}/"), impl)
    assert r["ok"], r
    assert r["grads_missing"] == 0 and r["grads_checked"] > 30
    assert r["bn_state_max"] < 1e-12 and r["logits_train"] < 1e-12
