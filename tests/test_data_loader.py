"""The deterministic per-process batcher and its prefetch thread."""
import itertools

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from snnjax.data.loader import Loader
from snnjax.data.prefetch import prefetch
from snnjax.data.source import ArraySource, Source


class IndexSource(Source):
    """Example i is an image filled with i (label i % 10); records every index it reads."""

    def __init__(self, n, time_steps=None):
        self.n, self.num_classes, self.time_steps = n, 10, time_steps
        self.example_shape = (2, 3, 1) if time_steps is None else (time_steps, 2, 3, 2)
        self.reads = []

    def __len__(self):
        return self.n

    def _read(self, indices):
        self.reads.extend(indices.tolist())
        values = indices.astype(np.float32).reshape(-1, *[1] * len(self.example_shape))
        inputs = np.broadcast_to(values, (len(indices), *self.example_shape)).copy()
        if self.time_steps is not None:
            inputs += np.arange(self.time_steps, dtype=np.float32).reshape(1, -1, 1, 1, 1) / 100
        return inputs, indices % 10


def ids(batch):
    """The example indices of a static-image batch of IndexSource."""
    return batch["inputs"][:, 0, 0, 0].astype(int)


def epoch_ids(loader, epoch, start_step=0):
    return [ids(b) for b in loader.epoch_batches(epoch, start_step)]


def make(n=50, batch=8, **kw):
    kw.setdefault("process_index", 0)
    kw.setdefault("process_count", 1)
    return Loader(IndexSource(n), batch, **kw)


def test_batch_layout_and_epoch_is_a_permutation():
    loader = make(50, 8, seed=3)
    assert loader.steps_per_epoch == 6 and loader.local_batch_size == 8
    batches = list(loader.epoch_batches(0))
    assert len(batches) == 6
    b = batches[0]
    assert b["inputs"].shape == (8, 2, 3, 1) and b["inputs"].dtype == np.float32
    assert b["labels"].dtype == np.int32 and b["mask"].all()
    np.testing.assert_array_equal(b["labels"], ids(b) % 10)
    seen = np.concatenate([ids(b) for b in batches])
    assert len(set(seen.tolist())) == 48  # no repeats; 2 examples dropped
    np.testing.assert_array_equal(seen, np.random.default_rng([3, 0]).permutation(50)[:48])


def test_order_is_a_function_of_seed_and_epoch():
    a, b = make(seed=1), make(seed=1)
    for epoch in (0, 1):
        assert np.array_equal(np.concatenate(epoch_ids(a, epoch)), np.concatenate(epoch_ids(b, epoch)))
    assert not np.array_equal(np.concatenate(epoch_ids(a, 0)), np.concatenate(epoch_ids(a, 1)))
    assert not np.array_equal(np.concatenate(epoch_ids(a, 0)), np.concatenate(epoch_ids(make(seed=2), 0)))
    plain = np.concatenate(epoch_ids(make(shuffle=False), 5))
    np.testing.assert_array_equal(plain, np.arange(48))


def test_start_step_resumes_exactly_without_reading_skipped_data():
    full = make(seed=7, prefetch=0)
    whole = epoch_ids(full, 2)
    resumed = make(seed=7, prefetch=0)
    tail = epoch_ids(resumed, 2, start_step=4)
    assert len(tail) == 2
    for got, want in zip(tail, whole[4:], strict=True):
        np.testing.assert_array_equal(got, want)
    assert sorted(resumed.source.reads) == sorted(np.concatenate(whole[4:]).tolist())
    assert epoch_ids(resumed, 2, start_step=6) == []
    with pytest.raises(ValueError):
        resumed.epoch_batches(0, start_step=7)


def test_endless_batches_cross_epochs_from_a_global_step():
    loader = make(30, 8, seed=5)  # 3 steps per epoch
    want = [ids(b) for e in range(3) for b in loader.epoch_batches(e)]
    got = [ids(b) for b in itertools.islice(loader.batches(start_step=2), 7)]
    for g, w in zip(got, want[2:9], strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_process_slices_partition_the_global_batch(drop_remainder):
    n, gbs = 43, 8
    single = make(n, gbs, seed=9, drop_remainder=drop_remainder)
    for count in (2, 4, 8):
        loaders = [make(n, gbs, seed=9, drop_remainder=drop_remainder, process_index=k,
                        process_count=count) for k in range(count)]
        assert all(loader.steps_per_epoch == single.steps_per_epoch for loader in loaders)
        assert all(loader.local_batch_size == gbs // count for loader in loaders)
        per_process = [list(loader.epoch_batches(1)) for loader in loaders]
        for step, whole in enumerate(single.epoch_batches(1)):
            parts = [batches[step] for batches in per_process]
            for key in ("inputs", "labels", "mask"):
                np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
        # Each process read only its own slices.
        if drop_remainder:
            reads = [set(loader.source.reads) for loader in loaders]
            assert all(not reads[i] & reads[j] for i in range(count) for j in range(i + 1, count))


def test_no_drop_remainder_pads_last_batch_and_masks_it():
    loader = make(43, 8, seed=0, drop_remainder=False)
    batches = list(loader.epoch_batches(0))
    assert loader.steps_per_epoch == 6 and len(batches) == 6
    assert all(b["inputs"].shape[0] == 8 for b in batches)
    last = batches[-1]
    np.testing.assert_array_equal(last["mask"], [True, True, True, False, False, False, False, False])
    real = np.concatenate([ids(b)[b["mask"]] for b in batches])
    np.testing.assert_array_equal(np.sort(real), np.arange(43))


def test_event_batches_are_time_major():
    src = IndexSource(20, time_steps=4)
    loader = Loader(src, 4, seed=0, process_index=0, process_count=1)
    batch = next(iter(loader.epoch_batches(0)))
    assert batch["inputs"].shape == (4, 4, 2, 3, 2) and batch["inputs"].flags.c_contiguous
    order = loader.epoch_order(0)[:4]
    want, _ = src.read(order)
    np.testing.assert_array_equal(batch["inputs"], want.transpose(1, 0, 2, 3, 4))


def test_invalid_configurations():
    with pytest.raises(ValueError, match="multiple of process_count"):
        make(50, 6, process_count=4, process_index=0)
    with pytest.raises(ValueError, match="process_index"):
        make(50, 8, process_count=2, process_index=2)
    with pytest.raises(ValueError, match="no batch"):
        make(5, 8)


def test_defaults_come_from_jax():
    loader = Loader(ArraySource(np.zeros((16, 2, 2, 1)), np.zeros(16), 10), 8)
    assert (loader.process_index, loader.process_count) == (0, 1)


def test_prefetch_keeps_order_and_propagates_errors():
    assert list(prefetch(iter(range(20)), 3)) == list(range(20))

    def broken():
        yield 1
        raise KeyError("boom")
    it = prefetch(broken(), 2)
    assert next(it) == 1
    with pytest.raises(KeyError, match="boom"):
        next(it)
    endless = prefetch(itertools.count(), 2)
    assert [next(endless) for _ in range(5)] == list(range(5))
    endless.close()  # stops the producer thread


def test_batches_become_global_arrays_over_8_devices():

    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    loader = Loader(IndexSource(64, time_steps=3), 16, seed=0, process_index=0, process_count=1)
    batch = next(iter(loader.epoch_batches(0)))
    inputs = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec(None, "data")), batch["inputs"])
    labels = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("data")),
                                                    batch["labels"])
    assert inputs.shape == (3, 16, 2, 3, 2) and len(inputs.addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(inputs), batch["inputs"])
    np.testing.assert_array_equal(np.asarray(labels), batch["labels"])
