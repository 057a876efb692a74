"""README claims that no other test backs, each checked on a real export: resume reads nothing
already consumed, `robowds demo` end to end, the `.wids.json` index read by `wids`, and torchrun's
RANK / WORLD_SIZE fallback."""

from __future__ import annotations

import itertools
import json
import re
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest

import robowds.reader.dataset
from robowds.reader import Remote, ShardDataset
from robowds.reader.plan import PlanSpec, rank_sequence
from robowds.reader.source import ShardSource

from exports import export_synthetic

Range = tuple[str, int, int]  # (shard path, start, stop)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # val listed (the two episodes robowds drew from val: 0.34 before plan 2): the counts below are of 4 train episodes
    return export_synthetic(tmp_path_factory.mktemp("claims"), 6, 3, "--stride", "2",
                            "--set", "shard.max_samples=12", "--set", "splits.val=[ep_0000, ep_0005]")


class CountingSource(ShardSource):
    """A real ShardSource that records every byte range the dataset asks it for (read or read ahead).
    The lists are the class's at the time the source is made (the dataset makes its own source per
    pass): a source of an earlier pass whose read-ahead still runs in a thread writes to its own
    pass's lists, never to the next pass's (CI drew a resumed pass "reading" a consumed range so)."""

    spans: list[Range] = []
    prefetches: list[Range] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._spans, self._prefetches = CountingSource.spans, CountingSource.prefetches

    def span(self, path: str, start: int, stop: int) -> tuple[Any, int]:
        self._spans.append((path, start, stop))
        return super().span(path, start, stop)

    def prefetch(self, path: str, start: int, stop: int) -> None:
        self._prefetches.append((path, start, stop))
        super().prefetch(path, start, stop)


def _ranges_read(monkeypatch: pytest.MonkeyPatch, ds: ShardDataset) -> tuple[list[str], list[Range], list[Range]]:
    """(keys handed out, ranges read, ranges read ahead) over one pass of `ds`."""
    CountingSource.spans, CountingSource.prefetches = [], []
    monkeypatch.setattr(robowds.reader.dataset, "ShardSource", CountingSource)
    keys = [s["__key__"] for s in ds]
    return keys, list(CountingSource.spans), list(CountingSource.prefetches)


def _overlaps(a: Range, b: Range) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


@pytest.mark.parametrize("remote", [False, True], ids=["mapped", "ranged-reads"])
def test_resume_reads_nothing_already_consumed(out: Path, monkeypatch: pytest.MonkeyPatch, remote: bool) -> None:
    """Cut after `cut` samples and resume from the cursor: the resumed pass reads (and reads ahead)
    only byte ranges of samples not yet consumed, exactly the rest of the uninterrupted pass's
    (remote: one request per sample, `max_request_bytes=0`; coalesced requests are the next test)."""
    base = out.resolve().as_uri() if remote else str(out)
    options = {"seed": 5, "block": 8, "remote": Remote(max_request_bytes=0)}
    keys, spans, _ = _ranges_read(monkeypatch, ShardDataset(base, "train", **options))
    n = len(keys)
    assert n > 20 and len(spans) == n and len(set(spans)) == n  # one distinct range per sample
    assert len({path for path, _, _ in spans}) >= 3  # the cut crosses shards
    for cut in (1, n // 3, n - 2):
        first = ShardDataset(base, "train", **options)
        assert [s["__key__"] for s in itertools.islice(iter(first), cut)] == keys[:cut]
        resumed = ShardDataset(base, "train", **options)
        resumed.load_cursor(first.cursor(cut))
        rest, read, ahead = _ranges_read(monkeypatch, resumed)
        assert rest == keys[cut:]
        assert read == spans[cut:]
        consumed = spans[:cut]
        assert not [r for r in read + ahead for c in consumed if _overlaps(r, c)]


def test_a_coalesced_resume_requests_only_what_holds_unconsumed_samples(out: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With coalesced remote requests (the default), a resumed pass hands out exactly the rest, in
    fewer requests than samples, and every request holds at least one sample not yet consumed (a
    request may carry a consumed neighbour's bytes as filler between two unconsumed ones)."""
    base = out.resolve().as_uri()
    per_sample = ShardDataset(base, "train", seed=5, block=8, remote=Remote(max_request_bytes=0))
    keys, spans, _ = _ranges_read(monkeypatch, per_sample)
    n = len(keys)
    for cut in (1, n // 3, n - 2):
        first = ShardDataset(base, "train", seed=5, block=8)
        assert [s["__key__"] for s in itertools.islice(iter(first), cut)] == keys[:cut]
        resumed = ShardDataset(base, "train", seed=5, block=8)
        resumed.load_cursor(first.cursor(cut))
        rest, read, ahead = _ranges_read(monkeypatch, resumed)
        assert rest == keys[cut:]
        requests = read + ahead
        assert 0 < len(requests) < max(2, n - cut) or n - cut <= 2
        unconsumed = spans[cut:]
        assert all(any(_overlaps(r, u) for u in unconsumed) for r in requests), requests


def test_robowds_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`robowds demo` runs all five steps and its resumed read equals the uninterrupted epoch (6 episodes
    instead of the default 24 to stay fast; the README's `make demo` block runs the default)."""
    from robowds.export.cli.main import main

    assert main(["demo", "--dir", str(tmp_path / "demo"), "--episodes", "6"]) == 0
    text = capsys.readouterr().out
    assert [line[:4] for line in text.splitlines() if line[:1].isdigit()] == ["1/5 ", "2/5 ", "3/5 ", "4/5 ", "5/5 "]
    read = re.search(r"read (\d+) of (\d+) batches; cursor \(\d+ bytes\): (\{.*\})", text)
    resumed = re.search(r"resumed: (\d+) more samples; identical to the uninterrupted epoch: (\w+)", text)
    assert read and resumed, text
    assert resumed.group(2) == "True"
    half, batches, cursor = int(read.group(1)), int(read.group(2)), json.loads(read.group(3))
    train = ShardDataset(tmp_path / "demo" / "out", "train", seed=0)
    assert (batches, half) == (-(-len(train) // 32), batches // 2)
    assert cursor["consumed"] == half * 32 and half * 32 + int(resumed.group(1)) == len(train)


def _tar_samples(shard: Path) -> list[tuple[str, dict[str, bytes]]]:
    """(key, {'.suffix': bytes}) per sample of a shard, read with the standard library's tarfile."""
    samples: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(shard) as tar:
        for info in tar:
            key, dot, suffix = info.name.partition(".")
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            fh = tar.extractfile(info)
            assert fh is not None
            samples[-1][1][dot + suffix] = fh.read()
    return samples


@pytest.mark.parametrize("split", ["train", "val"])
def test_wids_index_is_read_by_wids(out: Path, tmp_path: Path, split: str) -> None:
    """`wids.ShardListDataset` over `<split>.wids.json` (the real `wids` package, no decoding) hands out
    every sample of the split's shards, in shard order, with the same members and bytes as tarfile."""
    import wids  # in the test extras: a missing package fails here rather than skipping
    shards = json.loads((out / "manifest.json").read_text())["splits"][split]["shards"]
    expected = [s for shard in shards for s in _tar_samples(out / shard["path"])]
    assert len(shards) >= 2 and len(expected) == sum(shard["samples"] for shard in shards)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # wids prints its cache settings and warns about them
        ds = wids.ShardListDataset(str(out / f"{split}.wids.json"), transformations=[], cache_dir=str(tmp_path))
    assert len(ds) == len(expected)
    got = [(s["__key__"], {k: v.getvalue() for k, v in s.items() if k.startswith(".")}) for s in ds]
    assert got == expected


def test_torchrun_environment_sets_the_rank(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No rank arguments and no process group: RANK / WORLD_SIZE (as torchrun sets them) decide, and the
    dataset reads exactly rank 1's part of the plan (keys looked up independently, by tar order)."""
    import torch.distributed

    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = ShardDataset(out, "train", seed=5, block=8)
    shards = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]
    keys = [key for shard in shards for key, _ in _tar_samples(out / shard["path"])]  # sample id -> key
    plan = rank_sequence(PlanSpec(tuple(s["samples"] for s in shards), 5, True, 8, "pad"), 0, 2, 1)
    assert len(plan) == len(keys) // 2 == 67  # half the epoch: what a world of 1 reads is twice as long
    assert [s["__key__"] for s in ds] == [keys[i] for i in plan]
