"""verify's check of the episode facts file (`episode-facts.msgpack`, `job/episode_facts.py`), beyond
the size and sha256 every side file gets: it decodes, and agrees with the manifest on which episodes
were exported, in which split, and how many windows (samples) each split holds. Runs with and without `--since`
(every append rewrites the file). Cost: one decode, O(episodes)."""

from __future__ import annotations

from typing import Any

from robowds.export.check.result import VerifyResult
from robowds.export.job.episode_facts import decode_facts


def check_facts(data: bytes, manifest: dict[str, Any], where: str, result: VerifyResult) -> None:
    """Append to `result.failures` what is wrong with the facts file's bytes `data` (named `where`);
    a file that does not decode raises ValueError naming `where` (verify records it as a failure)."""
    facts = decode_facts(data, where)
    rows = {ep: i for i, ep in enumerate(facts.episode_id)}
    listed = {ep: split for split, e in manifest["splits"].items() for ep in e.get("episodes", [])}
    wrong = sorted(ep for ep, split in listed.items()
                   if ep not in rows or facts.split[rows[ep]] != split or not facts.exported[rows[ep]])
    if wrong:
        result.failures.append(f"{where}: has no row of {len(wrong)} exported episode(s) in their split, "
                               f"e.g. {wrong[0]!r}")
        return
    for split, entry in sorted(manifest["splits"].items()):  # a window is a sample
        windows = sum(int(facts.windows[rows[ep]]) for ep in entry.get("episodes", []))
        if "samples" in entry and windows != entry["samples"]:
            result.failures.append(f"{where}: its episodes of split {split!r} have {windows} windows, the "
                                   f"split holds {entry['samples']} samples")
