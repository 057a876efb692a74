"""The outcome of `robowds verify`: counts and every problem found. Its own module because both the
shard checks (verify.py) and the window recompute (recompute.py) add to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VerifyResult:
    shards: int = 0
    samples: int = 0
    recomputed: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, object]:
        """What `verify --json` prints: the counts, the verdict and every failure (unbounded)."""
        return {"ok": self.ok, "shards": self.shards, "samples": self.samples, "recomputed": self.recomputed,
                "failures": list(self.failures)}

    def render(self) -> str:
        head = (f"verified {self.shards} shards, {self.samples} samples"
                + (f", {self.recomputed} windows recomputed from the store" if self.recomputed else ""))
        if self.ok:
            return head + ": OK"
        shown = "\n  ".join(self.failures[:50])
        more = f"\n  ... and {len(self.failures) - 50} more" if len(self.failures) > 50 else ""
        return f"{head}: {len(self.failures)} problem(s)\n  {shown}{more}"
