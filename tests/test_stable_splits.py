"""Splits and sample keys that never move (issue 25 item 3): an episode's split is a function of (its id,
the seed, the split rules) and its key prefix a function of its id, never of which other episodes the
store holds; an export planned the old way (a permutation of all ids) is never taken as up to date."""
from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.core.shard_plan import KEY_PREFIX_MAX, assign_splits, key_prefixes
from robowds.reader.format import KEY_RE

from exports import export_members

IDS = st.lists(st.text(alphabet="ab.-_/ é1", max_size=10), unique=True, max_size=30)
SEEDS = st.integers(0, 2**63)


def _draw(episode_id: str, seed: int) -> float:
    """The draw assign_splits documents, written out here: BLAKE2b-64 of "seed:id" -> [0, 1)."""
    digest = hashlib.blake2b(f"{seed}:{episode_id}".encode(), digest_size=8, person=b"robowds.split.v1").digest()
    return int.from_bytes(digest, "big") / 2 ** 64


@st.composite
def fraction_rules(draw: st.DrawFn) -> dict[str, object]:
    """1 to 3 fraction splits (adding up to at most 1) and the rest split, in a drawn order."""
    names = draw(st.lists(st.sampled_from(["val", "test", "holdout"]), min_size=1, max_size=3, unique=True))
    left, rules = 1.0, {}
    for name in names:
        rules[name] = draw(st.floats(0.0, left))
        left -= rules[name]
    items = [*rules.items(), ("train", "rest")]
    return dict(draw(st.permutations(items)))


def _by_fractions(ids: list[str], rules: dict[str, object], seed: int) -> dict[str, str]:
    """The documented rule: the first fraction (in the rules' order) whose running sum passes the draw."""
    out = {}
    for ep in ids:
        total, out[ep] = 0.0, "train"
        for name, rule in rules.items():
            if isinstance(rule, float):
                total += rule
                if _draw(ep, seed) < total:
                    out[ep] = name
                    break
    return out


@given(IDS, st.data(), fraction_rules(), SEEDS)
@settings(max_examples=80, deadline=None)
def test_adding_or_removing_episodes_never_moves_another(ids: list[str], data: st.DataObject,
                                                         rules: dict[str, object], seed: int) -> None:
    kept = data.draw(st.lists(st.sampled_from(ids), unique=True) if ids else st.just([]))
    listed = data.draw(st.lists(st.sampled_from(kept), unique=True, max_size=3) if kept else st.just([]))
    rules = {**rules, "picked": listed}  # a list rule naming only kept episodes holds for both stores
    small, grown = assign_splits(kept, rules, seed), assign_splits(ids, rules, seed)
    assert small == {ep: grown[ep] for ep in kept}
    assert key_prefixes(kept) == {ep: p for ep, p in key_prefixes(ids).items() if ep in small}


@given(IDS, st.data(), fraction_rules(), SEEDS)
@settings(max_examples=60, deadline=None)
def test_precedence_declared_then_lists_then_fractions_then_rest(ids: list[str], data: st.DataObject,
                                                                rules: dict[str, object], seed: int) -> None:
    declared = data.draw(st.dictionaries(st.sampled_from(ids), st.sampled_from(["val", "column"]), max_size=5)
                         if ids else st.just({}))
    free = [ep for ep in ids if ep not in declared]
    listed = data.draw(st.lists(st.sampled_from(free), unique=True, max_size=4) if free else st.just([]))
    out = assign_splits(ids, {**rules, "picked": listed}, seed, declared)
    assert {ep: out[ep] for ep in declared} == declared
    assert all(out[ep] == "picked" for ep in listed)
    rest = [ep for ep in free if ep not in listed]
    assert {ep: out[ep] for ep in rest} == _by_fractions(rest, rules, seed)


@pytest.mark.parametrize("seed", [0, 12345])
def test_fractions_hold_within_3_sigma_over_20000_ids(seed: int) -> None:
    ids = [f"episode_{i:06d}" for i in range(20_000)]
    rules = {"val": 0.05, "test": 0.2, "train": "rest"}
    counts = Counter(assign_splits(ids, rules, seed).values())
    for name, p in (("val", 0.05), ("test", 0.2), ("train", 0.75)):
        sigma = math.sqrt(len(ids) * p * (1 - p))
        assert abs(counts[name] - len(ids) * p) <= 3 * sigma, (name, counts)


@given(SEEDS, SEEDS)
@settings(max_examples=20, deadline=None)
def test_deterministic_given_the_seed_and_different_for_another(s1: int, s2: int) -> None:
    assume(s1 != s2)
    ids = [f"ep_{i:04d}" for i in range(200)]
    rules = {"val": 0.5, "train": "rest"}
    a = assign_splits(ids, rules, s1)
    assert a == assign_splits(list(reversed(ids)), rules, s1) == _by_fractions(ids, rules, s1)
    assert a != assign_splits(ids, rules, s2)  # equal with probability 2**-200


def _colliders(episode_id: str) -> list[str]:
    """Ids that turn into the same text as `episode_id` once unsafe characters become `-` and the text
    is cut to 40 characters."""
    return [episode_id.replace("-", "."), episode_id.replace("-", " "), episode_id + "/x" * 30,
            "-" + episode_id[1:] if episode_id else "/"]


@given(st.lists(st.text(alphabet="ab-_.é", min_size=1, max_size=45), unique=True, min_size=1, max_size=10))
@settings(max_examples=80, deadline=None)
def test_key_prefixes_stay_when_colliding_ids_are_added(ids: list[str]) -> None:
    before = key_prefixes(ids)
    added = list(dict.fromkeys(c for ep in ids for c in _colliders(ep) if c not in before))
    after = key_prefixes([*ids, *added])
    assert {ep: after[ep] for ep in ids} == before
    assert len(set(after.values())) == len(after)  # still unique
    for prefix in after.values():
        assert len(prefix) <= KEY_PREFIX_MAX and KEY_RE.match(prefix + "_000000")


def test_tar_safe_ids_keep_their_keys() -> None:
    """Ids of A-Z a-z 0-9 _ - up to 40 characters are their own key prefix, as before plan 2."""
    ids = ["ep_0001", "AUTOLab-5d05c5aa-2023-07-07-10h-09m-44s", "x" * 40]
    assert key_prefixes([*ids, "ep.0001", "x" * 41]) == {
        **{ep: ep for ep in ids}, "ep.0001": key_prefixes(["ep.0001"])["ep.0001"],
        "x" * 41: key_prefixes(["x" * 41])["x" * 41]}


# --- end to end: a store of N episodes and the same store grown by 3 ---

SETTINGS = ["--quiet", "--workers", "1", "--stride", "16", "--set", "splits.val=0.3", "--set", "splits.test=0.2"]


def _export(root: Path, episodes: int) -> Path:
    write_synthetic_store(root / "store", episodes=episodes, seed=7)  # episode i drawn from (7, i)
    assert main(["export", str(root / "store"), str(root / "out"), *SETTINGS]) == 0
    return root / "out"


def test_grown_store_keeps_every_old_episode_in_its_split_with_the_same_samples(tmp_path: Path) -> None:
    small, grown = _export(tmp_path / "small", 4), _export(tmp_path / "grown", 7)  # 4 in train, val, test
    docs = [json.loads((out / "manifest.json").read_text()) for out in (small, grown)]
    where = [{ep: split for split, entry in doc["splits"].items() for ep in entry["episodes"]} for doc in docs]
    old = [f"ep_{i:04d}" for i in range(4)]
    rules = {"train": "rest", "val": 0.3, "test": 0.2}
    assert where[0] == {ep: where[1][ep] for ep in old} == _by_fractions(old, rules, 0)
    assert where[1] == _by_fractions([f"ep_{i:04d}" for i in range(7)], rules, 0)
    assert set(where[0].values()) == {"train", "val", "test"}
    samples = [export_members(out) for out in (small, grown)]
    assert samples[0]  # the old episodes' samples: same keys, byte-identical members, in the same split
    assert samples[0] == {key: members for key, members in samples[1].items()
                          if json.loads(members["meta.json"])["episode_id"] in old}
    for doc, placed in zip(docs, where):  # the report counts what each split really got
        assert {name: c["episodes"] for name, c in doc["report"]["splits"].items()} == {
            name: sum(s == name for s in placed.values()) for name in ("test", "train", "val")}
        assert doc["plan_version"] == 2


def test_summary_shows_each_splits_real_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_synthetic_store(tmp_path / "store", episodes=4, seed=7)
    capsys.readouterr()
    assert main(["export", str(tmp_path / "store"), str(tmp_path / "out"), "--workers", "1", "--stride", "8",
                 "--set", "splits.val=0.4", "--set", "splits.test=0.2"]) == 0
    report = json.loads((tmp_path / "out" / "manifest.json").read_text())["report"]["splits"]
    placed = _by_fractions([f"ep_{i:04d}" for i in range(4)], {"val": 0.4, "test": 0.2}, 0)
    assert Counter(placed.values()) == {"val": 3, "train": 1}  # test 0.2 of 4 drew none
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"splits: test 0 episodes (0 windows), train 1 episode ({report['train']['windows']} windows), "
                        f"val 3 episodes ({report['val']['windows']} windows)")
    assert lines[2:] == [
        "warning: split 'test' got no episode (of 4 exported): its shard list is empty; splits.test: 0.2 is a "
        "fraction, which holds on average only (each episode's split is drawn from a hash of its id and the seed, "
        "so a few episodes can give none); list the split's episode ids instead (splits.test: [id, ...]) or set "
        "another seed (--set seed=1)"]


def _old_job_id(doc: dict) -> str:
    """The job id robowds wrote before plan 2 (run.py's `_job_id` without the plan)."""
    old = {"source": doc["source"]["fingerprint"], "config": doc["config"], "tool": doc["tool_version"]}
    return hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()


def test_an_export_planned_the_old_way_is_not_up_to_date(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OUT written by robowds before plan 2 (its job id without the plan, no `plan_version`, other
    splits): the same command must neither call it up to date nor resume it, but say why and rebuild it
    with --overwrite."""
    out = _export(tmp_path, 4)
    manifest = out / "manifest.json"
    new = json.loads(manifest.read_text())
    doc = {k: v for k, v in new.items() if k != "plan_version"}
    doc["job_id"] = _old_job_id(doc)
    manifest.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["export", str(tmp_path / "store"), str(out), *SETTINGS]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds an export made by an older robowds (plan version 1), which drew episodes' splits and " \
           "sample keys differently from this one (plan version 2" in err
    assert "fix: pass --overwrite to replace it" in err
    assert main(["export", str(tmp_path / "store"), str(out), *SETTINGS, "--overwrite"]) == 0
    assert json.loads(manifest.read_text()) == new
