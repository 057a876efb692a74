"""The batch path (reader/batching.py): fixed-shape arrays copied straight from the mapped shard into
the batch tensors give exactly the batches the per-sample path (decode, then `reader.collate`) gives:
same names, order, dtypes, shapes, values, keys, meta and text; in-process and from 2 DataLoader
workers, from a resume cursor mid-epoch, with pin_memory; custom collate_fn keeps the per-sample path."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.collation import Collate, collate
from robowds.reader.layout import RawArray, SampleDecoder
from robowds.reader.manifest import read_local_index

from exports import export_synthetic

BATCH = 8


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # two short episodes; the image excluded, so every array member is a fixed-shape .npy
    return export_synthetic(tmp_path_factory.mktemp("batching"), 3, 4, "--stride", "3",
                            "--set", "shard.max_samples=16", "--set", "exclude=[overview]")


def test_array_views_are_the_decoded_arrays_bytes_in_place(out: Path) -> None:
    ds = ShardDataset(out, "train", shuffle=False)
    shard = ds.shards[0]
    offsets = read_local_index(out, shard).tolist()
    with open(out / shard.path, "rb") as fh:
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    decoder = SampleDecoder(ds.members)
    assert decoder.array_views(buf, offsets[0], offsets[1]) is None  # nothing learned yet
    first = decoder.decode(buf, offsets[0], offsets[1], "s", offsets[0])
    views = decoder.array_views(buf, offsets[1], offsets[2])
    second = decoder.decode(buf, offsets[1], offsets[2], "s", offsets[1])
    arrays = {k for k, v in second.items() if isinstance(v, np.ndarray) and v.ndim >= 1}
    assert views is not None and set(views) == arrays and len(arrays) >= 4
    for name, (data, dtype, shape) in views.items():
        assert isinstance(data, memoryview) and data.obj is buf  # in place, not copied
        assert (dtype, shape) == (second[name].dtype, second[name].shape)
        assert bytes(data) == second[name].tobytes()
    raw = decoder.decode(buf, offsets[1], offsets[2], "s", offsets[1], raw=True)
    assert list(raw) == list(second)  # same names, same order
    assert all(isinstance(raw[k], RawArray) for k in arrays)
    assert {k: v for k, v in raw.items() if k not in arrays} == {k: v for k, v in second.items() if k not in arrays}
    del views, raw, first, second, data
    buf.close()


class PerSample(Collate):
    """`Collate` under another type: the dataset hands it decoded ndarrays (the per-sample path)."""


def batches(out: Path, collate_fn: Any, workers: int = 0, consumed: int | None = None, **kwargs: Any) -> list[dict]:
    ds = ShardDataset(out, "train", seed=3, block=8)
    loader = ShardLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate_fn, **kwargs)
    if consumed is not None:
        loader.load_state_dict({**loader.state_dict(), "consumed": consumed})
    return list(loader)


def assert_same_batches(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected) > 1
    for a, b in zip(got, expected):
        assert list(a) == list(b)  # same names in the same order
        for name in a:
            if isinstance(b[name], torch.Tensor):
                assert isinstance(a[name], torch.Tensor), name
                assert (a[name].dtype, a[name].shape) == (b[name].dtype, b[name].shape), name
                assert a[name].is_contiguous() and torch.equal(a[name], b[name]), name
            else:
                assert a[name] == b[name], name


def test_raw_samples_reach_collate(out: Path) -> None:
    """The batch path is taken: matched samples carry RawArrays, and collating them equals collating
    the decoded ndarrays exactly."""
    ds = ShardDataset(out, "train", seed=3, block=8).set_batching(1, collate_fn=collate)
    assert ds._raw_batches()
    from robowds.reader.source import ShardSource
    source = ShardSource(ds.base, shards=ds.shards)
    ids = ds.sequence().tolist()
    raw = list(ds.reads().samples(source, iter(ids), raw=True))
    plain = list(ds.reads().samples(source, iter(ids), raw=False))
    assert sum(isinstance(v, RawArray) for s in raw for v in s.values()) >= 4 * (len(ids) - 2)
    assert not any(isinstance(v, RawArray) for s in plain for v in s.values())
    for i in range(0, len(ids), BATCH):
        assert_same_batches([collate(raw[i:i + BATCH]), collate(raw[i:i + BATCH])],
                            [collate(plain[i:i + BATCH]), PerSample()(plain[i:i + BATCH])])
    assert not ShardDataset(out, "train").set_batching(1, collate_fn=PerSample())._raw_batches()
    assert not ShardDataset(out, "train", transform=lambda s, r: s).set_batching(1, collate_fn=collate)._raw_batches()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("consumed", [None, 13])
def test_same_batches_as_the_per_sample_path(out: Path, workers: int, consumed: int | None) -> None:
    expected = batches(out, PerSample(), 0, consumed)
    assert_same_batches(batches(out, collate, workers, consumed), expected)
    if consumed is not None:  # the resumed batches are the tail of the uninterrupted run's samples
        keys = [k for b in batches(out, collate) for k in b["__key__"]]
        assert [k for b in expected for k in b["__key__"]] == keys[consumed:]


def _raw(a: np.ndarray) -> RawArray:
    return RawArray(memoryview(a.tobytes()), a.dtype, a.shape)


@pytest.mark.parametrize("case", ["middle", "padded", "channels_first", "big_endian", "scalar", "mixed_shapes"])
def test_raw_arrays_collate_as_their_ndarrays(case: str) -> None:
    """Every kind of field the row copy must not take (or takes) gives the ndarrays' batch exactly."""
    rng = np.random.default_rng(0)
    arrays = {"x": [rng.random((3, 2)).astype(np.float32) for _ in range(3)],
              "x_mask": [np.array([True, False, True])] * 3,
              "img": [rng.integers(0, 255, (2, 4, 3), dtype=np.uint8) for _ in range(3)],
              "be": [np.arange(4, dtype=">f4") + i for i in range(3)],
              "s": [np.array(i, np.int16) for i in range(3)],
              "v": [np.arange(n, dtype=np.int64) for n in (2, 3, 2)]}
    collate_fn = Collate(fields={"x": {"pad": "max_len", "max_len": 4}} if case == "padded" else None,
                         channels_first=case == "channels_first")
    plain = [{"__key__": str(i), **{k: v[i] for k, v in arrays.items()}, "task": "t"} for i in range(3)]
    raw = [{k: (_raw(v) if isinstance(v, np.ndarray) and (case != "middle" or i == 1) else v) for k, v in s.items()}
           for i, s in enumerate(plain)]
    got, expected = collate_fn(raw), collate_fn(plain)
    assert_same_batches([got, got], [expected, expected])
    assert "x_pad_mask" in got if case == "padded" else "x_pad_mask" not in got
    assert got["img"].shape == ((3, 3, 2, 4) if case == "channels_first" else (3, 2, 4, 3))
    assert got["be"].dtype == torch.float32 and got["s"].shape == (3,) and got["v_pad_mask"].shape == (3, 3)


# --- reused shared memory (reader/batching.py) ---

def test_workers_reuse_slots_and_never_overwrite_a_batch_still_held(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of an epoch kept alive (whole, as one field's view, or as a numpy array) is still
    exactly the per-sample path's batch at the end; batches dropped at once are reused."""
    import robowds.reader.batching as batching

    opened: list[bool] = []  # per batch that crossed in a slot: whether the slot was reused
    original = batching.SlotReceiver.open

    def counting(self: batching.SlotReceiver, batch: batching.SlotBatch) -> dict:
        opened.append(batch.storage is None)
        return original(self, batch)

    monkeypatch.setattr(batching.SlotReceiver, "open", counting)
    monkeypatch.setattr(batching, "MAX_SLOTS", 3)  # the forked workers inherit it
    expected = batches(out, PerSample(), 0)
    for keep in ("dict", "view", "numpy"):
        opened.clear()
        held: list[Any] = []
        for batch in ShardLoader(ShardDataset(out, "train", seed=3, block=8), batch_size=BATCH, num_workers=2):
            held.append(batch if keep == "dict" else batch["joints"][1:] if keep == "view" else batch["imu"].numpy())
            del batch
        assert len(held) == len(expected) > 2 * batching.MAX_SLOTS  # so some batches found no free slot
        assert len(opened) == 2 * batching.MAX_SLOTS and not any(opened)  # held: no slot was ever reused
        for got, want in zip(held, expected):
            if keep == "dict":
                assert_same_batches([got, got], [want, want])
            elif keep == "view":
                assert torch.equal(got, want["joints"][1:])
            else:
                assert np.array_equal(got, want["imu"].numpy())
    opened.clear()
    loader = ShardLoader(ShardDataset(out, "train", seed=3, block=8), batch_size=BATCH, num_workers=2)
    for i, batch in enumerate(loader):  # each batch dropped before the next
        assert_same_batches([batch, batch], [expected[i], expected[i]])
        del batch
    assert len(opened) == len(expected) and sum(opened) >= len(expected) - 2 * batching.MAX_SLOTS


def test_pin_memory_and_resume_with_reused_slots(out: Path) -> None:
    expected = batches(out, PerSample(), 0, 21)
    assert_same_batches(batches(out, collate, 2, 21, pin_memory=True), expected)


def test_the_next_pass_reuses_released_slots_and_keeps_held_ones(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second epoch's workers get the slots the first epoch's batches released, whose storage never
    crosses again, and never a slot whose batch the trainer still holds. How many slots the first epoch
    makes depends on timing (how soon the trainer's releases reach the workers), so the test reads
    which slots the main process gave out rather than assuming a number."""
    import robowds.reader.batching as batching

    opened: list[tuple[tuple, bool]] = []  # per batch opened: (its slot, whether its storage crossed with it)
    given: list[set[tuple]] = []  # per pass: the free slots the main process gave its workers
    original_open, original_start = batching.SlotReceiver.open, batching.SlotReceiver.start

    def counting(self: batching.SlotReceiver, batch: batching.SlotBatch) -> dict:
        opened.append((batch.slot, batch.storage is not None))
        return original_open(self, batch)

    def recording(self: batching.SlotReceiver, workers: int) -> batching.SlotSpec:
        spec = original_start(self, workers)
        given.append({slot for per_worker in spec.given for slot, _ in per_worker})
        return spec

    monkeypatch.setattr(batching.SlotReceiver, "open", counting)
    monkeypatch.setattr(batching.SlotReceiver, "start", recording)
    reference = ShardLoader(ShardDataset(out, "train", seed=3, block=8), batch_size=BATCH, collate_fn=PerSample())
    expected = [list(reference), list(reference)]  # epochs 0 and 1
    loader = ShardLoader(ShardDataset(out, "train", seed=3, block=8), batch_size=BATCH, num_workers=2)
    held, slots = [], []
    for epoch in (0, 1):
        opened.clear()
        for i, batch in enumerate(loader):
            assert_same_batches([batch, batch], [expected[epoch][i], expected[epoch][i]])
            if epoch == 0 and i >= len(expected[0]) - 2:
                held.append(batch)  # the trainer keeps the epoch's last two batches
            del batch
        assert len(opened) == len(expected[epoch])
        slots.append(list(opened))
    made = {slot for slot, _ in slots[0]}
    held_slots = {slot for slot, _ in slots[0][-2:]}
    assert given[1] == made - held_slots  # every released slot of epoch 0 is given out, no held one
    used = [(slot, crossed) for slot, crossed in slots[1] if slot in made]
    assert not {slot for slot, _ in slots[1]} & held_slots  # a held batch's memory is never written
    assert all(not crossed for _, crossed in used)  # a given slot's storage does not cross again
    assert bool(used) == bool(given[1])  # and the workers use what they were given
    assert_same_batches(held, expected[0][-2:])


def test_surplus_free_slots_are_unmapped_at_the_next_pass(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slots freed after the trainer held many batches do not stay mapped beyond what a pass can use."""
    import robowds.reader.batching as batching

    monkeypatch.setattr(batching, "MAX_SLOTS", 2)
    reference = ShardLoader(ShardDataset(out, "train", seed=3, block=8), batch_size=BATCH, collate_fn=PerSample())
    expected = [list(reference), list(reference)]  # epochs 0 and 1
    loader = ShardLoader(ShardDataset(out, "train", seed=3, block=8), batch_size=BATCH, num_workers=2)
    held = list(loader)  # every batch of epoch 0 kept: 2 x 2 slots held, the rest in fresh storages
    assert_same_batches(held, expected[0])
    assert len(loader._slots.slots) == 4 and loader._slots.held == set(loader._slots.slots)
    del held
    assert not loader._slots.held
    loader.num_workers = 1  # epoch 1 with 1 worker: it gets 2 of the 4 free slots, the other 2 are unmapped
    got = []
    for batch in loader:
        assert len(loader._slots.slots) == 2
        got.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        del batch
    assert_same_batches(got, expected[1])


def test_npz_layout_takes_the_batch_path_with_the_same_batches(tmp_path: Path) -> None:
    """A `shard.layout=npz` export: its packed arrays reach Collate as RawArrays too, same batches."""
    npz = export_synthetic(tmp_path, 3, 4, "--stride", "3", "--set", "shard.max_samples=16",
                           "--set", "exclude=[overview]", "--set", "shard.layout=npz")
    ds = ShardDataset(npz, "train", seed=3, block=8).set_batching(1, collate_fn=collate)
    from robowds.reader.source import ShardSource
    ids = ds.sequence().tolist()
    raw = list(ds.reads().samples(ShardSource(ds.base, shards=ds.shards), iter(ids), raw=True))
    assert sum(isinstance(v, RawArray) for s in raw for v in s.values()) >= 4 * (len(ids) - 2)
    expected = batches(npz, PerSample(), 0)
    for workers in (0, 2):
        assert_same_batches(batches(npz, collate, workers), expected)
