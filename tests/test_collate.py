"""Tests for reader/collation.py: stacking, the three pad modes, masks, images, pass-through fields, errors."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.reader.collation import Collate, collate


def _window(key: str, offset: float) -> dict:
    return {"__key__": key,
            "joints": np.arange(6, dtype=np.float32).reshape(3, 2) + offset,  # [T=3, N=2]
            "joints_mask": np.array([True, True, offset > 0]),  # [T]
            "task": f"task {key}",
            "meta": {"episode_id": key, "anchor": int(offset)}}


def _tokens(key: str, values: list[int], dtype: str = "int64") -> dict:
    return {"__key__": key, "tokens": np.array(values, dtype=dtype)}


def _assert_tensor(actual: torch.Tensor, expected: list, dtype: torch.dtype) -> None:
    assert isinstance(actual, torch.Tensor)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=dtype), rtol=0, atol=0)


# --- stacking ---

def test_equal_shapes_stack_with_dtypes_kept() -> None:
    batch = collate([_window("a", 0), _window("b", 10)])
    _assert_tensor(batch["joints"], [[[0, 1], [2, 3], [4, 5]], [[10, 11], [12, 13], [14, 15]]], torch.float32)
    _assert_tensor(batch["joints_mask"], [[True, True, False], [True, True, True]], torch.bool)
    assert batch["joints"].shape == (2, 3, 2) and batch["joints_mask"].shape == (2, 3)
    assert not any(k.endswith("_pad_mask") for k in batch)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32", "int64", "uint16", "float16", "float64"])
def test_stack_preserves_every_dtype(dtype: str) -> None:
    arrays = [np.arange(4, dtype=dtype).reshape(2, 2) + i for i in range(3)]
    out = collate([{"__key__": str(i), "x": a} for i, a in enumerate(arrays)])["x"]
    assert out.numpy().dtype == np.dtype(dtype) and out.shape == (3, 2, 2)
    np.testing.assert_array_equal(out.numpy(), np.stack(arrays))


def test_stacked_tensor_owns_a_copy() -> None:
    a = np.zeros((2, 2), np.float32)
    out = collate([{"__key__": "a", "x": a}])["x"]
    a[0, 0] = 7
    assert out[0, 0, 0].item() == 0 and out.is_contiguous()


def test_non_native_byte_order_is_converted() -> None:
    a = np.arange(3, dtype=">f4")
    out = collate([{"__key__": "a", "x": a}, {"__key__": "b", "x": a}])["x"]
    _assert_tensor(out, [[0, 1, 2], [0, 1, 2]], torch.float32)


# --- strings, dicts, keys, scalars ---

def test_strings_dicts_none_and_keys_become_lists() -> None:
    batch = collate([{**_window("a", 0), "note": None}, {**_window("b", 1), "note": "x"}])
    assert batch["__key__"] == ["a", "b"]
    assert batch["task"] == ["task a", "task b"]
    assert batch["meta"] == [{"episode_id": "a", "anchor": 0}, {"episode_id": "b", "anchor": 1}]
    assert batch["note"] == [None, "x"]


def test_dunder_fields_pass_through_as_lists() -> None:
    batch = collate([{"__key__": "a", "__skipped__": 0, "__url__": "s0"},
                     {"__key__": "b", "__skipped__": 3, "__url__": "s0"}])
    assert batch["__skipped__"] == [0, 3] and batch["__url__"] == ["s0", "s0"]


def test_scalars_become_1d_tensors() -> None:
    samples = [{"__key__": "a", "i": 1, "f": 0.5, "b": True, "z": np.array(2.5, np.float32), "g": np.int16(4)},
               {"__key__": "b", "i": 2, "f": 1.5, "b": False, "z": np.array(-1, np.float32), "g": np.int16(-4)}]
    batch = collate(samples)
    _assert_tensor(batch["i"], [1, 2], torch.int64)
    _assert_tensor(batch["f"], [0.5, 1.5], torch.float64)
    _assert_tensor(batch["b"], [True, False], torch.bool)
    _assert_tensor(batch["z"], [2.5, -1.0], torch.float32)
    _assert_tensor(batch["g"], [4, -4], torch.int16)


def test_output_order_follows_fields_with_pad_mask_after_its_field() -> None:
    batch = collate([{"__key__": "a", "t": np.zeros(1), "s": "x"}, {"__key__": "b", "t": np.zeros(2), "s": "y"}])
    assert list(batch) == ["__key__", "t", "t_pad_mask", "s"]


# --- padding ---

def test_batch_max_pads_to_longest_with_pad_mask() -> None:
    batch = Collate(pad_value=-1)([_tokens("a", [5, 6]), _tokens("b", [7, 8, 9, 10]), _tokens("c", [])])
    _assert_tensor(batch["tokens"], [[5, 6, -1, -1], [7, 8, 9, 10], [-1, -1, -1, -1]], torch.int64)
    _assert_tensor(batch["tokens_pad_mask"], [[True, True, False, False], [True] * 4, [False] * 4], torch.bool)


def test_batch_max_pads_2d_along_first_dim_only() -> None:
    a = np.array([[1.0, 2.0]], np.float32)  # [L=1, D=2]
    b = np.array([[3.0, 4.0], [5.0, 6.0], [7.0, 8.0]], np.float32)  # [L=3, D=2]
    batch = collate([{"__key__": "a", "emb": a}, {"__key__": "b", "emb": b}])
    _assert_tensor(batch["emb"], [[[1, 2], [0, 0], [0, 0]], [[3, 4], [5, 6], [7, 8]]], torch.float32)
    _assert_tensor(batch["emb_pad_mask"], [[True, False, False], [True, True, True]], torch.bool)


def test_max_len_pads_and_truncates() -> None:
    batch = Collate(pad="max_len", max_len=3)([_tokens("a", [1]), _tokens("b", [1, 2, 3, 4, 5]), _tokens("c", [4, 5, 6])])
    _assert_tensor(batch["tokens"], [[1, 0, 0], [1, 2, 3], [4, 5, 6]], torch.int64)
    _assert_tensor(batch["tokens_pad_mask"], [[True, False, False], [True] * 3, [True] * 3], torch.bool)


def test_max_len_mode_needs_max_len() -> None:
    with pytest.raises(ValueError, match="max_len"):
        Collate(pad="max_len")
    with pytest.raises(ValueError, match="multiple_of"):
        Collate(pad="multiple_of")
    with pytest.raises(ValueError, match="pad must be one of"):
        Collate(pad="longest")
    with pytest.raises(ValueError, match="positive int"):
        Collate(pad="max_len", max_len=0)


def test_multiple_of_rounds_longest_up() -> None:
    c = Collate(pad="multiple_of", multiple_of=4)
    batch = c([_tokens("a", [1, 2, 3, 4, 5]), _tokens("b", [6])])  # longest 5 -> 8
    _assert_tensor(batch["tokens"], [[1, 2, 3, 4, 5, 0, 0, 0], [6, 0, 0, 0, 0, 0, 0, 0]], torch.int64)
    _assert_tensor(batch["tokens_pad_mask"], [[True] * 5 + [False] * 3, [True] + [False] * 7], torch.bool)
    batch = c([_tokens("a", [1, 2, 3, 4]), _tokens("b", [6])])  # already a multiple: 4 stays 4
    _assert_tensor(batch["tokens"], [[1, 2, 3, 4], [6, 0, 0, 0]], torch.int64)


def test_bool_arrays_pad_with_false_whatever_pad_value() -> None:
    batch = Collate(pad_value=1)([{"__key__": "a", "flags": np.array([True])},
                                  {"__key__": "b", "flags": np.array([True, True, True])}])
    _assert_tensor(batch["flags"], [[True, False, False], [True, True, True]], torch.bool)
    _assert_tensor(batch["flags_pad_mask"], [[True, False, False], [True, True, True]], torch.bool)


def test_per_step_mask_is_padded_with_its_field() -> None:
    samples = [{"__key__": "a", "act_mask": np.array([True, False]), "act": np.array([1.0, 2.0], np.float32)},
               {"__key__": "b", "act_mask": np.array([True, True, True, False]),
                "act": np.array([3.0, 4.0, 5.0, 6.0], np.float32)}]
    c = Collate(pad_value=9, fields={"act": {"pad": "multiple_of", "multiple_of": 3}})
    batch = c(samples)
    _assert_tensor(batch["act"], [[1, 2, 9, 9, 9, 9], [3, 4, 5, 6, 9, 9]], torch.float32)
    _assert_tensor(batch["act_pad_mask"], [[True, True] + [False] * 4, [True] * 4 + [False] * 2], torch.bool)
    _assert_tensor(batch["act_mask"], [[True, False] + [False] * 4, [True, True, True, False, False, False]], torch.bool)
    assert "act_mask_pad_mask" not in batch
    assert list(batch) == ["__key__", "act_mask", "act", "act_pad_mask"]


def test_per_field_override_and_global_default() -> None:
    c = Collate(pad_value=0, fields={"tokens": {"pad": "multiple_of", "multiple_of": 8, "pad_value": -1}})
    samples = [{**_tokens("a", [1, 2, 3]), "ids": np.array([4, 5], np.int32)},
               {**_tokens("b", [1]), "ids": np.array([6], np.int32)}]
    batch = c(samples)
    _assert_tensor(batch["tokens"], [[1, 2, 3] + [-1] * 5, [1] + [-1] * 7], torch.int64)
    _assert_tensor(batch["tokens_pad_mask"], [[True] * 3 + [False] * 5, [True] + [False] * 7], torch.bool)
    _assert_tensor(batch["ids"], [[4, 5], [6, 0]], torch.int32)  # not overridden: batch_max, pad 0
    _assert_tensor(batch["ids_pad_mask"], [[True, True], [True, False]], torch.bool)


def test_configured_field_is_padded_even_when_lengths_agree() -> None:
    batch = Collate(fields={"tokens": {"pad": "max_len", "max_len": 3}})([_tokens("a", [1, 2]), _tokens("b", [3, 4])])
    _assert_tensor(batch["tokens"], [[1, 2, 0], [3, 4, 0]], torch.int64)
    _assert_tensor(batch["tokens_pad_mask"], [[True, True, False], [True, True, False]], torch.bool)


def test_field_override_inherits_global_options() -> None:
    c = Collate(max_len=2, pad_value=-5, fields={"tokens": {"pad": "max_len"}})
    _assert_tensor(c([_tokens("a", [1, 2, 3])])["tokens"], [[1, 2]], torch.int64)
    with pytest.raises(ValueError, match="unknown padding option"):
        Collate(fields={"tokens": {"pad": "max_len", "maxlen": 4}})


def test_pad_value_that_does_not_fit_the_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="pad_value -1 does not fit dtype uint8"):
        Collate(pad_value=-1)([_tokens("a", [1], "uint8"), _tokens("b", [1, 2], "uint8")])


# --- images ---

def test_images_stack_and_channels_first() -> None:
    imgs = [np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) + i for i in range(2)]  # [H=2, W=3, C=3]
    samples = [{"__key__": str(i), "rgb": im, "depth": im[..., :2].copy()} for i, im in enumerate(imgs)]
    batch = collate(samples)
    assert batch["rgb"].shape == (2, 2, 3, 3) and batch["rgb"].dtype == torch.uint8
    np.testing.assert_array_equal(batch["rgb"].numpy(), np.stack(imgs))
    batch = Collate(channels_first=True)(samples)
    assert batch["rgb"].shape == (2, 3, 2, 3) and batch["rgb"].is_contiguous()
    np.testing.assert_array_equal(batch["rgb"].numpy(), np.stack(imgs).transpose(0, 3, 1, 2))
    assert batch["rgb"][1, 2, 1, 0].item() == imgs[1][1, 0, 2]
    assert batch["depth"].shape == (2, 2, 3, 2)  # 2 channels: not an image layout, left alone


def test_channels_first_leaves_windows_alone() -> None:
    batch = Collate(channels_first=True)([{"__key__": "a", "x": np.zeros((2, 3, 3), np.float32)}])
    assert batch["x"].shape == (1, 2, 3, 3)


# --- errors ---

def test_empty_batch_raises() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        collate([])


def test_missing_field_names_field_and_key() -> None:
    a, b = _window("ep_0001_000000", 0), _window("ep_0002_000007", 1)
    del b["task"]
    with pytest.raises(ValueError, match=r"'task' is missing from sample 'ep_0002_000007'"):
        collate([a, b])
    with pytest.raises(ValueError, match=r"'task' is missing from sample 'ep_0002_000007'"):
        collate([b, a])  # also when the first sample lacks it


def test_shape_mismatch_beyond_first_dim_names_field_and_shapes() -> None:
    samples = [{"__key__": "a", "joints": np.zeros((3, 2))}, {"__key__": "b", "joints": np.zeros((3, 4))}]
    with pytest.raises(ValueError, match=r"'joints'.*\(3, 2\).*\(3, 4\)"):
        collate(samples)
    samples[1]["joints"] = np.zeros(3)
    with pytest.raises(ValueError, match=r"'joints'.*\(3, 2\).*\(3,\)"):
        collate(samples)


def test_dtype_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="different dtypes"):
        collate([_tokens("a", [1], "int32"), _tokens("b", [1], "int64")])


def test_configured_non_array_field_raises() -> None:
    with pytest.raises(ValueError, match="'task' is configured for padding"):
        Collate(fields={"task": {}})([_window("a", 0)])


def test_pad_mask_name_clash_raises() -> None:
    with pytest.raises(ValueError, match="clashes"):
        collate([{"__key__": "a", "t": np.zeros(1), "t_pad_mask": np.ones(1, bool)}])


def test_collate_pickles_for_dataloader_workers() -> None:
    c = pickle.loads(pickle.dumps(Collate(pad="multiple_of", multiple_of=4, fields={"t": {"pad_value": 3}})))
    _assert_tensor(c([_tokens("a", [1]), _tokens("b", [1, 2])])["tokens"], [[1, 0, 0, 0], [1, 2, 0, 0]], torch.int64)


# --- property: unpadding recovers the originals ---

MODES = st.one_of(st.just({"pad": "batch_max"}),
                  st.integers(1, 6).map(lambda m: {"pad": "multiple_of", "multiple_of": m}),
                  st.integers(1, 12).map(lambda n: {"pad": "max_len", "max_len": n}))


@settings(max_examples=300, deadline=None)
@given(mode=MODES, lengths=st.lists(st.integers(0, 10), min_size=1, max_size=6), dim=st.integers(1, 3),
       dtype=st.sampled_from(["float32", "int64", "bool", "uint8"]), data=st.data())
def test_unpadding_recovers_each_array(mode: dict, lengths: list[int], dim: int, dtype: str,
                                       data: st.DataObject) -> None:
    c = Collate(**mode, pad_value=7 if dtype == "uint8" else -7)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    arrays = [(rng.integers(0, 200, size=(n, dim)) % (2 if dtype == "bool" else 200)).astype(dtype) for n in lengths]
    masks = [rng.random(n) < 0.5 for n in lengths]
    batch = c([{"__key__": f"k{i}", "x": a, "x_mask": m} for i, (a, m) in enumerate(zip(arrays, masks))])
    x, x_mask, spec = batch["x"], batch["x_mask"], c.default
    if len(set(lengths)) == 1:  # equal lengths stack whatever the mode: no pad mask, nothing cut
        assert "x_pad_mask" not in batch and x.shape == (len(lengths), lengths[0], dim)
        np.testing.assert_array_equal(x.numpy(), np.stack(arrays))
        np.testing.assert_array_equal(x_mask.numpy(), np.stack(masks))
        return
    expected_len = {"batch_max": max(lengths), "max_len": spec["max_len"],
                    "multiple_of": -(-max(lengths) // (spec["multiple_of"] or 1)) * (spec["multiple_of"] or 1)}
    length, pad_mask = expected_len[spec["pad"]], batch["x_pad_mask"]
    assert x.shape == (len(lengths), length, dim) and pad_mask.shape == x_mask.shape == (len(lengths), length)
    assert x.dtype == torch.from_numpy(arrays[0]).dtype and pad_mask.dtype == x_mask.dtype == torch.bool
    for i, (a, m) in enumerate(zip(arrays, masks)):
        kept = min(len(a), length)  # max_len truncates the tail
        assert pad_mask[i].tolist() == [True] * kept + [False] * (length - kept)
        np.testing.assert_array_equal(x[i][pad_mask[i]].numpy(), a[:kept])
        np.testing.assert_array_equal(x_mask[i][pad_mask[i]].numpy(), m[:kept])
        assert not x_mask[i][~pad_mask[i]].any()  # per-step masks pad with False
        fill = False if dtype == "bool" else spec["pad_value"]
        assert (x[i][~pad_mask[i]].numpy() == fill).all()


class _CollateInWorker(torch.utils.data.IterableDataset):
    """Collates in a DataLoader worker and reports, from inside it, whether the batch memory is shared
    and which storage and address each tensor has."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        batch = Collate(fields={"tokens": {"pad": "multiple_of", "multiple_of": 4}}, channels_first=True)(
            [{**_window("a", 0.0), **_tokens("a", [1, 2, 3]), "img": np.full((2, 3, 3), 7, np.uint8)},
             {**_window("b", 1.0), **_tokens("b", [4]), "img": np.full((2, 3, 3), 9, np.uint8)}])
        tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        yield {"shared": {k: v.is_shared() for k, v in tensors.items()},
               "storages": {k: v.untyped_storage().data_ptr() for k, v in tensors.items()},
               "addresses": {k: v.data_ptr() for k, v in tensors.items()},
               "batch": batch}


def test_batches_built_in_a_worker_are_already_in_shared_memory() -> None:
    """Collated in a worker, every tensor is allocated in shared memory (no copy on the way to the
    main process); the values are the same as collated in the main process."""
    item = next(iter(torch.utils.data.DataLoader(_CollateInWorker(), batch_size=None, num_workers=1)))
    assert item["shared"] and all(item["shared"].values()), item["shared"]
    local = next(iter(_CollateInWorker()))
    assert not any(local["shared"].values())  # outside a worker: plain tensors
    for name, value in local["batch"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(item["batch"][name], value), name
    assert tuple(local["batch"]["img"].shape) == (2, 3, 2, 3)  # channels first
    assert local["batch"]["tokens"].tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]]


def test_a_batch_built_in_a_worker_is_one_storage_with_aligned_fields() -> None:
    """Inside a worker every tensor of the batch views one shared storage, each starting on a 64-byte
    boundary and none overlapping another, so the batch crosses to the main process as one file
    descriptor; outside a worker each tensor has its own storage."""
    inside = next(iter(torch.utils.data.DataLoader(_CollateInWorker(), batch_size=None, num_workers=1)))
    assert len(set(inside["storages"].values())) == 1, inside["storages"]
    spans = sorted((inside["addresses"][k], inside["addresses"][k] + inside["batch"][k].nbytes)
                   for k in inside["addresses"])
    assert all(start % 64 == 0 for start, _ in spans)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    local = next(iter(_CollateInWorker()))
    assert len(set(local["storages"].values())) == len(local["storages"]) > 1
