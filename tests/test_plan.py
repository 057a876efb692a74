"""Tests for the export plan (export/core/shard_plan.py): splits, key prefixes, window order, shard packing."""
from __future__ import annotations

import hashlib
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from robowds.export.core.shard_plan import KEY_PREFIX_MAX, assign_splits, key_prefixes, pack_shards, window_order
from robowds.export.errors import UserError
from robowds.reader.format import KEY_RE

IDS20 = [f"ep_{i:04d}" for i in range(20)]


# --- assign_splits ---

def _draw(episode_id: str, seed: int) -> float:
    """The documented draw (shard_plan.split_draw's docstring), written out here so a change to it fails."""
    digest = hashlib.blake2b(f"{seed}:{episode_id}".encode(), digest_size=8, person=b"robowds.split.v1").digest()
    return int.from_bytes(digest, "big") / 2 ** 64


def test_fractions_follow_the_documented_draw_exactly() -> None:
    rules = {"val": 0.1, "test": 0.3, "train": "rest"}
    out = assign_splits(IDS20, rules, seed=0)
    assert set(out) == set(IDS20)
    expected = {ep: "val" if _draw(ep, 0) < 0.1 else "test" if _draw(ep, 0) < 0.1 + 0.3 else "train" for ep in IDS20}
    assert out == expected
    # the counts are what the draws give (binomial around 2 / 6 / 12), not rounded fractions
    assert Counter(out.values()) == {"val": 5, "test": 4, "train": 11}


@pytest.mark.parametrize("n, fraction, expected", [(7, 0.3, 2), (9, 0.3, 3), (11, 0.15, 2), (3, 0.0, 0), (3, 1.0, 3)])
def test_fraction_count_is_what_the_draws_give(n: int, fraction: float, expected: int) -> None:
    ids = [f"e{i}" for i in range(n)]
    out = assign_splits(ids, {"val": fraction, "train": "rest"}, seed=3)
    assert sum(v == "val" for v in out.values()) == expected == sum(_draw(e, 3) < fraction for e in ids)
    assert sum(v == "train" for v in out.values()) == n - expected


def test_assignment_is_deterministic_and_seeded() -> None:
    rules = {"val": 0.25, "train": "rest"}
    a = assign_splits(IDS20, rules, seed=1)
    assert a == assign_splits(IDS20, rules, seed=1)
    others = [assign_splits(IDS20, rules, seed=s) for s in range(2, 8)]
    assert any(o != a for o in others)  # the seed matters


@given(st.randoms(use_true_random=False), st.integers(0, 2**32 - 1))
@settings(max_examples=50, deadline=None)
def test_assignment_independent_of_input_order(rnd: random.Random, seed: int) -> None:
    rules = {"val": 0.2, "test": 0.1, "train": "rest"}
    shuffled = list(IDS20)
    rnd.shuffle(shuffled)
    assert assign_splits(shuffled, rules, seed) == assign_splits(IDS20, rules, seed)


def test_explicit_lists_take_precedence_and_fractions_draw_the_remaining_episodes() -> None:
    ids = [f"e{i}" for i in range(10)]
    rules = {"val": 0.5, "test": ["e3", "e7"], "train": "rest"}
    out = assign_splits(ids, rules, seed=0)
    assert out["e3"] == out["e7"] == "test"
    free = [e for e in ids if e not in ("e3", "e7")]
    assert {e: out[e] for e in free} == {e: "val" if _draw(e, 0) < 0.5 else "train" for e in free}
    assert Counter(out.values()) == {"test": 2, "val": 3, "train": 5}


def test_declared_split_takes_precedence_over_lists_and_fractions() -> None:
    ids = [f"e{i}" for i in range(10)]
    declared = {"e0": "holdout", "e1": "val", "e2": "test"}
    rules = {"val": 0.5, "test": ["e2", "e5"], "train": "rest"}
    out = assign_splits(ids, rules, seed=0, declared=declared)
    assert out["e0"] == "holdout"  # a declared split need not be in the rules
    assert out["e1"] == "val" and out["e2"] == "test" and out["e5"] == "test"
    free = [e for e in ids if e not in ("e0", "e1", "e2", "e5")]  # 6 drawn: val when the draw is < 0.5
    assert {e: out[e] for e in free} == {e: "val" if _draw(e, 0) < 0.5 else "train" for e in free}
    assert Counter(out.values()) == {"holdout": 1, "val": 4, "test": 2, "train": 3}


def test_declared_episodes_are_not_reshuffled_by_other_rules() -> None:
    ids = [f"e{i}" for i in range(10)]
    rules = {"val": 0.3, "train": "rest"}
    with_decl = assign_splits(ids, rules, seed=5, declared={"e8": "train"})
    assert with_decl["e8"] == "train" and _draw("e8", 5) < 0.3  # the draw alone would have put it in val
    assert with_decl == {**assign_splits(ids, rules, seed=5), "e8": "train"}  # the others drew as without it


def test_unknown_id_in_list_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"splits\.val names episode 'nope'"):
        assign_splits(["a", "b"], {"val": ["nope"], "train": "rest"}, seed=0)


def test_integer_ids_in_lists_are_matched_as_strings() -> None:
    out = assign_splits(["1", "2", "3"], {"val": [2], "train": "rest"}, seed=0)
    assert out == {"1": "train", "2": "val", "3": "train"}


def test_episode_in_two_lists_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"'b' is assigned to both 'val' and 'test'"):
        assign_splits(["a", "b"], {"val": ["b"], "test": ["b"], "train": "rest"}, seed=0)


def test_list_contradicting_declared_split_is_a_user_error() -> None:
    with pytest.raises(UserError, match="assigned to both 'test' and 'val'"):
        assign_splits(["a", "b"], {"val": ["a"], "train": "rest"}, seed=0, declared={"a": "test"})


def test_list_agreeing_with_declared_split_is_fine() -> None:
    out = assign_splits(["a", "b"], {"val": ["a"], "train": "rest"}, seed=0, declared={"a": "val"})
    assert out == {"a": "val", "b": "train"}


@pytest.mark.parametrize("rule", [1.5, -0.1, "half", True])
def test_bad_rule_is_a_user_error(rule: object) -> None:
    with pytest.raises(UserError, match="splits.val"):
        assign_splits(["a", "b"], {"val": rule, "train": "rest"}, seed=0)


# --- key_prefixes ---

def _check_prefixes(ids: list[str]) -> dict[str, str]:
    out = key_prefixes(ids)
    assert set(out) == set(ids)
    assert len(set(out.values())) == len(ids), out
    for prefix in out.values():
        assert KEY_RE.match(prefix + "_000001"), prefix
        assert KEY_RE.match(prefix + "_999999"), prefix
        assert len(prefix) <= KEY_PREFIX_MAX
    return out


def test_safe_ids_are_kept_as_they_are() -> None:
    assert _check_prefixes(["ep_0001", "Ep-2", "x"]) == {"ep_0001": "ep_0001", "Ep-2": "Ep-2", "x": "x"}


def _hashed(episode_id: str) -> str:
    """The documented hash suffix of a changed id (shard_plan.key_prefix's docstring), written out."""
    return hashlib.blake2b(episode_id.encode(), digest_size=6, person=b"robowds.key.v1").hexdigest()


def test_unsafe_characters_are_replaced_and_the_id_hash_appended() -> None:
    assert _check_prefixes(["run 1/ep.3", "épi"]) == {"run 1/ep.3": f"run-1-ep-3-{_hashed('run 1/ep.3')}",
                                                     "épi": f"-pi-{_hashed('épi')}"}


def test_empty_id_becomes_ep_and_its_hash() -> None:
    assert _check_prefixes([""]) == {"": f"ep-{_hashed('')}"}


def test_ids_that_would_collide_are_told_apart_by_their_own_hash() -> None:
    out = _check_prefixes(["a.b", "a-b", "c", "a/b"])
    # "a-b" is tar-safe: kept; the others are changed, so they carry their id's hash, whoever else exists
    assert out == {"a-b": "a-b", "a.b": f"a-b-{_hashed('a.b')}", "a/b": f"a-b-{_hashed('a/b')}", "c": "c"}
    assert key_prefixes(["a.b"]) == {"a.b": out["a.b"]}


def test_empty_id_next_to_ep() -> None:
    assert _check_prefixes(["ep", ""]) == {"": f"ep-{_hashed('')}", "ep": "ep"}


def test_long_ids_are_shortened_and_stay_unique() -> None:
    ids = ["x" * 50 + "1", "x" * 50 + "2", "y" * 45, "z" * 40]
    out = _check_prefixes(ids)
    assert out["z" * 40] == "z" * 40  # 40 characters: kept
    assert out["y" * 45] == "y" * 27 + "-" + _hashed("y" * 45)
    assert out["x" * 50 + "1"] == "x" * 27 + "-" + _hashed("x" * 50 + "1")
    assert out["x" * 50 + "2"] == "x" * 27 + "-" + _hashed("x" * 50 + "2")


def test_prefixes_do_not_depend_on_input_order() -> None:
    ids = ["a.b", "a-b", "zz", "a b", ""]
    assert key_prefixes(ids) == key_prefixes(list(reversed(ids)))


def test_an_id_spelling_another_ids_hashed_prefix_is_a_user_error() -> None:
    clash = f"a-b-{_hashed('a.b')}"  # tar-safe, so kept as it is: the same prefix as "a.b"'s
    with pytest.raises(UserError, match=rf"episodes '{clash}' and 'a.b' get the same sample key prefix") as info:
        key_prefixes(["a.b", clash])
    assert "rename one of them" in (info.value.hint or "")


@given(st.lists(st.text(alphabet="ab.-_/ é", max_size=6), unique=True, max_size=12))
@settings(max_examples=200, deadline=None)
def test_prefixes_unique_and_tar_safe(ids: list[str]) -> None:
    _check_prefixes(ids)


# --- window_order ---

def _canonical(counts: list[int]) -> list[tuple[int, int]]:
    return [(e, w) for e, c in enumerate(counts) for w in range(c)]


def test_window_order_canonical_exact() -> None:
    rows = window_order([2, 0, 3], seed=0, split_name="train", shuffle=False)
    assert rows.dtype == np.int64 and rows.shape == (5, 2)
    assert rows.tolist() == [[0, 0], [0, 1], [2, 0], [2, 1], [2, 2]]


def test_window_order_empty() -> None:
    for shuffle in (False, True):
        rows = window_order([], seed=0, split_name="train", shuffle=shuffle)
        assert rows.shape[0] == 0
        assert window_order([0, 0], 0, "train", shuffle).shape == (0, 2)


COUNTS = st.lists(st.integers(0, 12), max_size=10)


@given(COUNTS, st.integers(0, 2**32 - 1), st.booleans())
@settings(max_examples=100, deadline=None)
def test_window_order_is_a_permutation_of_all_windows(counts: list[int], seed: int, shuffle: bool) -> None:
    rows = window_order(counts, seed, "train", shuffle)
    assert rows.dtype == np.int64 and rows.shape == (sum(counts), 2)
    pairs = [tuple(r) for r in rows.tolist()]
    assert sorted(pairs) == _canonical(counts)  # every (episode, window) exactly once
    if not shuffle:
        assert pairs == _canonical(counts)


@given(COUNTS, st.integers(0, 2**32 - 1))
@settings(max_examples=100, deadline=None)
def test_window_order_same_seed_same_order(counts: list[int], seed: int) -> None:
    a = window_order(counts, seed, "val", True)
    np.testing.assert_array_equal(a, window_order(list(counts), seed, "val", True))


@given(st.lists(st.integers(0, 12), min_size=3, max_size=10).filter(lambda c: sum(c) >= 20),
       st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
@settings(max_examples=100, deadline=None)
def test_window_order_different_seed_different_order(counts: list[int], s1: int, s2: int) -> None:
    assume(s1 != s2)
    assert not np.array_equal(window_order(counts, s1, "train", True), window_order(counts, s2, "train", True))


@given(st.lists(st.integers(0, 12), min_size=3, max_size=10).filter(lambda c: sum(c) >= 20),
       st.integers(0, 2**32 - 1), st.text(max_size=8), st.text(max_size=8))
@settings(max_examples=100, deadline=None)
def test_window_order_differs_between_splits(counts: list[int], seed: int, a: str, b: str) -> None:
    assume(a != b)
    assert not np.array_equal(window_order(counts, seed, a, True), window_order(counts, seed, b, True))


# --- pack_shards ---

def test_pack_shards_exact() -> None:
    # overhead 1024, max 4096: 1000+1000 -> 3024; +1500 would be 4524 > 4096 -> close
    assert pack_shards([1000, 1000, 1500, 1500, 5000, 10], max_samples=10, max_bytes=4096, overhead=1024) == [
        (0, 2), (2, 4), (4, 5), (5, 6)]
    assert pack_shards([1] * 7, max_samples=3, max_bytes=10**9, overhead=1024) == [(0, 3), (3, 6), (6, 7)]
    assert pack_shards([], max_samples=3, max_bytes=4096, overhead=1024) == []


def test_pack_shards_fits_exactly_at_max_bytes() -> None:
    assert pack_shards([1000, 2072, 1], max_samples=10, max_bytes=4096, overhead=1024) == [(0, 2), (2, 3)]


@given(st.lists(st.integers(0, 6000), max_size=40), st.integers(1, 8), st.integers(1024, 16384),
       st.integers(0, 2048))
@settings(max_examples=300, deadline=None)
def test_pack_shards_properties(sizes: list[int], max_samples: int, max_bytes: int, overhead: int) -> None:
    bounds = pack_shards(sizes, max_samples, max_bytes, overhead)
    # contiguous, in order, covering every sample, no empty shard
    expected_start = 0
    for start, stop in bounds:
        assert start == expected_start and stop > start
        expected_start = stop
    assert expected_start == len(sizes)
    for n, (start, stop) in enumerate(bounds):
        total = overhead + sum(sizes[start:stop])
        assert stop - start <= max_samples
        assert total <= max_bytes or stop - start == 1  # only a lone oversized sample may exceed
        if n + 1 < len(bounds):  # greedy: closed only because the next sample would not fit
            assert stop - start == max_samples or total + sizes[stop] > max_bytes


def test_pack_shards_min_shards_exact() -> None:
    # 10 samples, limits give 1 shard: cut into 8 runs of 1 or 2 (10 * k // 8), each packed by the limits
    assert pack_shards([10] * 10, max_samples=4096, max_bytes=10**9, overhead=1024, min_shards=8) == [
        (0, 1), (1, 2), (2, 3), (3, 5), (5, 6), (6, 7), (7, 8), (8, 10)]
    # fewer samples than min_shards: the limits alone (one shard)
    assert pack_shards([10] * 7, max_samples=4096, max_bytes=10**9, overhead=1024, min_shards=8) == [(0, 7)]
    # the limits already give >= min_shards shards: unchanged
    assert pack_shards([1] * 9, max_samples=3, max_bytes=10**9, overhead=0, min_shards=3) == [(0, 3), (3, 6), (6, 9)]
    # a run of the balanced cut that the byte limit splits again: limits still hold
    # (the limits alone: (0, 3), (3, 4); balanced runs (0, 1), (1, 2), (2, 4), the last one 6000 bytes)
    assert pack_shards([10, 10, 3000, 3000], max_samples=10, max_bytes=4096, overhead=0, min_shards=3) == [
        (0, 1), (1, 2), (2, 3), (3, 4)]
    assert pack_shards([], max_samples=3, max_bytes=4096, overhead=1024, min_shards=8) == []


@given(st.lists(st.integers(0, 6000), max_size=60), st.integers(1, 40), st.integers(1024, 16384),
       st.integers(0, 2048), st.integers(1, 12))
@settings(max_examples=300, deadline=None)
def test_pack_shards_min_shards_properties(sizes: list[int], max_samples: int, max_bytes: int, overhead: int,
                                           min_shards: int) -> None:
    bounds = pack_shards(sizes, max_samples, max_bytes, overhead, min_shards)
    greedy = pack_shards(sizes, max_samples, max_bytes, overhead)
    assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(len(sizes)))  # contiguous, in order, all
    for lo, hi in bounds:
        assert hi - lo <= max_samples
        assert overhead + sum(sizes[lo:hi]) <= max_bytes or hi - lo == 1
    if len(sizes) >= min_shards:
        assert len(bounds) >= min_shards
    if len(greedy) >= min_shards or len(sizes) < min_shards:
        assert bounds == greedy  # min_shards changes nothing where it is not needed
    else:  # balanced: without a byte split, shard sample counts differ by at most one
        counts = [hi - lo for lo, hi in bounds]
        if len(bounds) == min_shards:
            assert max(counts) - min(counts) <= 1
