"""Cursors are checked before they load (`reader/cursor.py`): a cursor that is not what `state_dict`
wrote (a key missing, of another type, out of range, unknown, a `consumed` past the epoch as the
saved topology split it) is one ValueError naming the key, for `ShardDataset`, `ShardLoader` and
`Mixture` alike; and a cursor saved on another export of the same split and size (another export
seed: the same sample count, other samples at each position) is refused, naming both exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import Mixture, ShardDataset, ShardLoader
from robowds.reader.plan import Topology

OPTIONS = ["--quiet", "--workers", "1", "--stride", "8", "--set", "shard.max_samples=8", "--set", "shard.min_shards=1"]
SAMPLES = 14  # per export: 2 episodes, an anchor every 8 frames


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One store exported twice, with export seeds 0 and 1: the same split and size, other job ids."""
    root = tmp_path_factory.mktemp("cursor")
    store = write_synthetic_store(root / "store", episodes=2, seed=3).root
    for seed in (0, 1):
        assert main(["export", str(store), str(root / f"out{seed}"), "--seed", str(seed), *OPTIONS]) == 0
    return root / "out0", root / "out1"


def dataset(out: Path, **kwargs: Any) -> ShardDataset:
    return ShardDataset(out, "train", seed=5, block=4, rank=0, world_size=1, **kwargs)


def mixture(first: Path, second: Path) -> Mixture:
    return Mixture([dataset(first), dataset(second)], [0.5, 0.5], seed=1, block=8, rank=0, world_size=1)


# (case id, change to a valid cursor, the message's start, with {what} the cursor's name)
Change = Callable[[dict[str, Any]], Any]
CASES: list[tuple[str, Change, str]] = [
    ("consumed negative", lambda s: {**s, "consumed": -5}, "{what} key 'consumed' is -5, must be >= 0"),
    ("consumed past the epoch", lambda s: {**s, "consumed": 10**9},
     "{what} key 'consumed' is 1000000000, but each of 1 ranks reads {n} positions of epoch 0"),
    ("consumed past a rank's share", lambda s: {**s, "world_size": 2, "consumed": SAMPLES + 1},
     "{what} key 'consumed' is 15, but each of 2 ranks reads {half} positions of epoch 0"),
    ("consumed a string", lambda s: {**s, "consumed": "3"}, "{what} key 'consumed' must be an integer, got \"3\""),
    ("consumed a bool", lambda s: {**s, "consumed": True}, "{what} key 'consumed' must be an integer, got true"),
    ("epoch negative", lambda s: {**s, "epoch": -1}, "{what} key 'epoch' is -1, must be >= 0"),
    ("epoch a float", lambda s: {**s, "epoch": 1.0}, "{what} key 'epoch' must be an integer, got 1.0"),
    ("epoch missing", lambda s: {k: v for k, v in s.items() if k != "epoch"}, "{what} key 'epoch' is missing"),
    ("seed missing", lambda s: {k: v for k, v in s.items() if k != "seed"}, "{what} key 'seed' is missing"),
    ("history missing", lambda s: {k: v for k, v in s.items() if k != "history"}, "{what} key 'history' is missing"),
    ("world_size 0", lambda s: {**s, "world_size": 0}, "{what} key 'world_size' is 0, must be >= 1"),
    ("batch_size a list", lambda s: {**s, "batch_size": [4]}, "{what} key 'batch_size' must be an integer, got [4]"),
    ("policy unknown", lambda s: {**s, "policy": "wrap"},
     "{what} key 'policy' is 'wrap', must be one of 'pad', 'drop'"),
    ("history a string", lambda s: {**s, "history": "2,3"}, "{what} key 'history' must be a list, got \"2,3\""),
    ("history entry of 3", lambda s: {**s, "history": [[2, 3, 4]]},
     "{what} key 'history': entry 0 must be a [world_size, consumed] pair, got [2, 3, 4]"),
    ("history world 0", lambda s: {**s, "history": [[0, 3]]},
     "{what} key 'history': entry 0's world_size is 0, must be >= 1"),
    ("history past its share", lambda s: {**s, "history": [[2, 2 * SAMPLES]]},
     "{what} key 'history': entry 0 says each of 2 ranks consumed 28 positions of epoch 0, but each had {half}"),
    ("unknown key", lambda s: {**s, "position": 3}, "{what} key 'position' is not one robowds writes"),
    ("worker without yielded", lambda s: {**s, "worker": {"id": 0, "workers": 2}},
     "{what} key 'worker': 'yielded' is missing"),
    ("worker id past workers", lambda s: {**s, "worker": {"id": 2, "workers": 2, "yielded": 0}},
     "{what} key 'worker': id 2 is not below workers 2"),
    ("a list", lambda s: list(s.items()), "{what} must be a dict (a JSON object), got list"),
    ("a string", lambda s: json.dumps(s), "{what} must be a dict (a JSON object), got str"),
]


def target(name: str, exports: tuple[Path, Path]) -> tuple[Any, str, int]:
    """What loads a cursor -> (it, the cursor's name in messages, positions per epoch)."""
    a, b = exports
    if name in ("ShardDataset", "ShardLoader"):
        return (dataset(a) if name == "ShardDataset" else ShardLoader(dataset(a), 4)), "cursor", SAMPLES
    return (mixture(a, b) if name == "Mixture" else ShardLoader(mixture(a, b), 4)), "mixture cursor", 2 * SAMPLES


@pytest.mark.parametrize("name", ["ShardDataset", "ShardLoader", "Mixture", "ShardLoader(Mixture)"])
@pytest.mark.parametrize("change, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_cursors_are_one_value_error_naming_the_key(exports: tuple[Path, Path], name: str, change: Change,
                                                        message: str) -> None:
    loader, what, n = target(name, exports)
    valid = json.loads(json.dumps(loader.state_dict()))
    loader.load_state_dict({**valid, "consumed": 1})  # the premise: unchanged, it loads
    with pytest.raises(ValueError) as info:
        loader.load_state_dict(change(valid))
    assert str(info.value).startswith(message.format(what=what, n=n, half=n // 2)), str(info.value)
    assert (loader.dataset if isinstance(loader, ShardLoader) else loader).start == 1  # the refused one changed nothing


def test_cursor_keys_of_one_kind(exports: tuple[Path, Path]) -> None:
    """Keys only one kind of cursor has are checked too; the edges load: `consumed` = a rank's whole
    share (a cursor saved at an epoch's end), and an elastic history that used its whole share."""
    a, b = exports
    ds = dataset(a)
    state = ds.cursor()
    for change, expected in ((lambda s: {**s, "shuffle": 1}, "cursor key 'shuffle' must be true or false, got 1"),
                             (lambda s: {**s, "split": None}, "cursor key 'split' must be a string, got null"),
                             (lambda s: {**s, "samples": -1}, "cursor key 'samples' is -1, must be >= 0"),
                             (lambda s: {**s, "export": 7}, "cursor key 'export' must be a string, got 7")):
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
            ds.load_cursor(change(state))
    ds.load_cursor({**state, "world_size": 2, "consumed": SAMPLES // 2})
    assert (ds.history, ds.start) == ((Topology(2, SAMPLES // 2),), 0)
    assert ds.epoch_length() == 0  # the two old ranks read the whole epoch
    ds.load_cursor({**state, "history": [[2, 7]], "consumed": 0})
    mix = mixture(a, b)
    cursor = mix.cursor()
    for change, expected in ((lambda s: {**s, "config": 5}, "mixture cursor key 'config' must be a string, got 5"),
                             (lambda s: {**s, "samples_per_epoch": -2},
                              "mixture cursor key 'samples_per_epoch' is -2, must be >= 0"),
                             (lambda s: {**s, "kind": None}, "not a mixture cursor of version 1: None")):
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
            mix.load_cursor(change(cursor))
    mix.load_cursor({**cursor, "consumed": 2 * SAMPLES})
    assert mix.at_epoch_end()


def test_a_cursor_of_another_export_of_the_same_size_is_refused(exports: tuple[Path, Path]) -> None:
    """Two exports of one store with export seeds 0 and 1: the same split and size, other samples at
    each position. The first's cursor is refused by the second (dataset and loader, and a mixture of
    the first twice by a mixture of both), naming both exports and the fix; it resumes the first
    exactly; a cursor saved before robowds recorded the export (no `export` key) still loads."""
    a, b = exports
    ids = [json.loads((out / "manifest.json").read_text())["job_id"][:16] for out in (a, b)]
    assert ids[0] != ids[1] and sum(dataset(a).counts) == sum(dataset(b).counts) == SAMPLES  # the premise
    first = ShardLoader(dataset(a), 4)
    it = iter(first)
    head = next(it)["__key__"]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["export"] == ids[0] and state["consumed"] == 4 and len(json.dumps(state)) < 300
    expected = (f"cursor key 'export': the cursor was saved on export {ids[0]}, this dataset reads export {ids[1]} "
                "(the first 16 hex digits of each manifest's job_id): its positions would be another export's "
                "samples. Fix: load the cursor with the export(s) it was saved from, or drop it and start afresh "
                "(a new loader without the cursor, or set_epoch(1) for the next epoch)")
    for other in (ShardLoader(dataset(b), 4), dataset(b)):
        with pytest.raises(ValueError) as info:
            other.load_state_dict(state)
        assert str(info.value) == expected
    same = ShardLoader(dataset(a), 4)
    same.load_state_dict(state)
    rest = [k for batch in same for k in batch["__key__"]]
    assert head + rest == [k for batch in ShardLoader(dataset(a), 4) for k in batch["__key__"]]
    old = {k: v for k, v in state.items() if k != "export"}  # saved before the identity was recorded
    accepting = dataset(b)
    accepting.load_cursor(old)
    assert accepting.start == 4

    mix_state = mixture(a, a).cursor(consumed=3)
    other_mix = mixture(a, b)  # the same names, weights, sizes and plans: only the second export differs
    assert other_mix.cursor()["config"] == mix_state["config"]
    with pytest.raises(ValueError, match=r"^mixture cursor key 'exports': the cursor was saved on sources whose "
                                         r"exports hash to [0-9a-f]{16}, this mixture's hash to [0-9a-f]{16} .*"
                                         r"set_epoch\(1\) for the next epoch\)$"):
        other_mix.load_cursor(mix_state)
    other_mix.load_cursor({k: v for k, v in mix_state.items() if k != "exports"})
    assert other_mix.start == 3
