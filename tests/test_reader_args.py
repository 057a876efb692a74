"""`ShardDataset`'s constructor in 15 parameters (issue 23): the remote-read options are one
`remote=Remote(...)` value, batching is set by whoever batches (`ShardLoader`, or `set_batching` under a
plain DataLoader). An old keyword is one TypeError naming its new form; `Remote` checks its fields
when made; and the cursor is the same dict it was, so cursors saved before still load."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import Mixture, Remote, RetryPolicy, ShardDataset, ShardLoader, collate

OPTIONS = ["--quiet", "--workers", "1", "--stride", "8", "--set", "shard.max_samples=8", "--set", "shard.min_shards=1"]
BATCH = 4


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small export: 3 episodes, 20 train samples in 3 shards."""
    root = tmp_path_factory.mktemp("args")
    store = write_synthetic_store(root / "store", episodes=3, seed=3).root
    assert main(["export", str(store), str(root / "out"), *OPTIONS]) == 0
    return root / "out"


def test_the_constructors_take_at_most_15_parameters_and_no_catch_all() -> None:
    params = inspect.signature(ShardDataset).parameters
    assert list(params) == ["source", "split", "shuffle", "seed", "block", "policy", "rank", "world_size", "transform",
                            "verify", "on_error", "remote", "video_layout", "fields", "exclude"]
    assert list(inspect.signature(Mixture).parameters) == ["datasets", "weights", "seed", "names", "samples_per_epoch",
                                                           "block", "policy", "transforms", "fill_missing", "rank",
                                                           "world_size"]


REMOTE_FORM = "pass remote=Remote({k}=...)"
BATCHING_FORM = ("pass {k} to ShardLoader(dataset, {k}=...), which sets it; with a plain DataLoader or "
                 "StatefulDataLoader call dataset.set_batching({k}=...)")
OLD = [("storage_options", {"anon": True}, REMOTE_FORM), ("retry", RetryPolicy(), REMOTE_FORM),
       ("max_request_bytes", 0, REMOTE_FORM), ("cache_dir", "/tmp/cache", REMOTE_FORM),
       ("cache_limit_bytes", 1 << 30, REMOTE_FORM), ("batch_size", 8, BATCHING_FORM),
       ("drop_last", True, BATCHING_FORM), ("collate_fn", collate, BATCHING_FORM)]


@pytest.mark.parametrize(("keyword", "value", "form"), OLD, ids=[k for k, _, _ in OLD])
def test_an_old_keyword_names_its_new_form(out: Path, keyword: str, value: Any, form: str) -> None:
    with pytest.raises(TypeError) as raised:
        ShardDataset(out, "train", seed=1, **{keyword: value})
    assert str(raised.value) == f"ShardDataset() got the old keyword {keyword!r}: {form.format(k=keyword)}"
    if form is BATCHING_FORM:
        with pytest.raises(TypeError) as raised:
            Mixture([ShardDataset(out, "train")], [1.0], **{keyword: value})
        assert str(raised.value) == f"Mixture() got the old keyword {keyword!r}: {form.format(k=keyword)}"


def test_remote_defaults_are_the_readers_and_bad_fields_are_named(out: Path, tmp_path: Path) -> None:
    assert Remote() == Remote(None, RetryPolicy(5, 0.5, 8.0, 60.0), 4 << 20, None, None)
    ds = ShardDataset(out, "train", remote=Remote({"anon": True}, RetryPolicy(attempts=2), 0, tmp_path, 1 << 20))
    assert (ds.storage_options, ds.retry.attempts, ds.max_request_bytes) == ({"anon": True}, 2, 0)
    assert (ds.cache.folder, ds.cache.limit_bytes) == (str(tmp_path), 1 << 20)
    bad = [({"storage_options": "anon"}, "Remote.storage_options must be a dict or None, got str"),
           ({"retry": 3}, "Remote.retry must be a RetryPolicy, got int"),
           ({"max_request_bytes": -1}, "Remote.max_request_bytes must be >= 0 (an int; 0: one request per sample), "
                                       "got -1"),
           ({"max_request_bytes": 1.5}, "Remote.max_request_bytes must be >= 0 (an int; 0: one request per sample), "
                                        "got 1.5"),
           ({"cache_dir": 7}, "Remote.cache_dir must be a path or None, got int"),
           ({"cache_dir": tmp_path, "cache_limit_bytes": -1}, "Remote.cache_limit_bytes must be >= 0 or None (an int), "
                                                              "got -1"),
           ({"cache_limit_bytes": 10}, "Remote.cache_limit_bytes needs cache_dir (the folder it bounds)")]
    for fields, message in bad:
        with pytest.raises(ValueError) as raised:
            Remote(**fields)
        assert str(raised.value) == message
    with pytest.raises(TypeError, match="^remote must be a robowds.reader.Remote, got dict$"):
        ShardDataset(out, "train", remote={"max_request_bytes": 0})


def test_a_cursor_saved_before_loads_and_the_cursor_is_unchanged(out: Path) -> None:
    """The cursor is the dict today's code wrote (a literal, as a checkpoint holds it), it loads, and
    the resumed pass is the rest of the uninterrupted one; the cursor written now adds only the
    export's generation (issue 25: a cursor across an append)."""
    whole = [k for b in ShardLoader(ShardDataset(out, "train", seed=5, block=4), batch_size=BATCH) for k in b["__key__"]]
    loader = ShardLoader(ShardDataset(out, "train", seed=5, block=4), batch_size=BATCH)
    export = loader.dataset.export_id
    saved = {"version": 2, "split": "train", "samples": 20, "seed": 5, "shuffle": True, "block": 4, "policy": "pad",
             "batch_size": 4, "epoch": 0, "consumed": 8, "world_size": 1, "history": [], "export": export}
    loader.load_state_dict(saved)
    assert [k for b in loader for k in b["__key__"]] == whole[8:]
    again = ShardLoader(ShardDataset(out, "train", seed=5, block=4), batch_size=BATCH)
    batches = iter(again)
    next(batches), next(batches)
    assert again.state_dict() == {**saved, "generation": 1}


@pytest.mark.parametrize("drop_last", [False, True])
def test_plain_dataloaders_get_equal_whole_batches_per_rank(out: Path, drop_last: bool) -> None:
    """`set_batching` under torch's own DataLoader: 20 samples on 3 ranks pad to 7 positions each (one
    sample read twice) or drop to 6, cut to a whole batch: the same number of batches on every rank
    (a DDP step never waits for a rank that has none)."""
    counts, keys = [], []
    for rank in range(3):
        ds = ShardDataset(out, "train", seed=2, rank=rank, world_size=3).set_batching(BATCH, drop_last=drop_last)
        batches = list(DataLoader(ds, batch_size=BATCH, collate_fn=collate, drop_last=drop_last))
        counts.append([len(b["__key__"]) for b in batches])
        keys += [k for b in batches for k in b["__key__"]]
    assert counts == [[4, 3]] * 3 if not drop_last else [[4]] * 3
    assert (len(keys), len(set(keys))) == ((21, 20) if not drop_last else (12, 12))
