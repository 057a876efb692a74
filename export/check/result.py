"""The outcome of `robowds verify`: counts and every problem found. Its own module because both the
shard checks (verify.py) and the window recompute (recompute.py) add to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VerifyResult:
    """`shards`: how many were read; with `since` (verify --since), `skipped` more are listed but were
    not read (generations <= since), `current` is the export's generation."""

    shards: int = 0
    samples: int = 0
    recomputed: int = 0
    failures: list[str] = field(default_factory=list)
    since: int | None = None
    selected: int = 0  # shards --since picked to read (`shards` counts those actually read: not missing)
    skipped: int = 0
    current: int = 1

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, object]:
        """What `verify --json` prints: the counts, the verdict and every failure (unbounded); with
        --since also `since`, `generation` (the export's) and `skipped` (shards not read)."""
        doc: dict[str, object] = {"ok": self.ok, "shards": self.shards, "samples": self.samples,
                                  "recomputed": self.recomputed, "failures": list(self.failures)}
        if self.since is not None:
            doc.update(since=self.since, generation=self.current, skipped=self.skipped)
        return doc

    def _shards(self) -> str:
        """`5 shards`, or with --since `2 of 5 shards (--since 1: 3 older shards not read)`."""
        if self.since is None:
            return f"{self.shards} shards"
        total = self.selected + self.skipped
        latest = (f"; generation {self.since} is the current one, nothing was appended since"
                  if self.since == self.current else "")
        return f"{self.shards} of {total} shards (--since {self.since}: {self.skipped} older shards not read{latest})"

    def render(self) -> str:
        head = (f"verified {self._shards()}, {self.samples} samples"
                + (f", {self.recomputed} windows recomputed from the store" if self.recomputed else ""))
        if self.ok:
            return head + ": OK"
        shown = "\n  ".join(self.failures[:50])
        more = f"\n  ... and {len(self.failures) - 50} more" if len(self.failures) > 50 else ""
        return f"{head}: {len(self.failures)} problem(s)\n  {shown}{more}"
