"""How many bytes an episode's windows will take, before any is built: the export's runaway and disk
checks (`export/core/plausible.py`) compare this against the source data and the free disk space. Pure."""

from __future__ import annotations

from pathlib import Path

from robowds.export.store.episodes import EpisodeData

TAR_HEADER = 512  # a tar member: this header, then its payload padded to 512-byte blocks
NPY_HEADER = 128  # at least, for the arrays a window holds


def member_bytes(payload: int) -> int:
    """A tar member's bytes: its header plus the payload padded to 512-byte blocks."""
    return TAR_HEADER + -(-payload // TAR_HEADER) * TAR_HEADER


def window_bytes(series: list[tuple[int, int, int]], static: list[int], cameras: list[tuple[int, int | None]]) -> int:
    """A lower bound on one window's bytes in a shard.

    `series`: (steps, values per step, output itemsize) of each time-series field; `static`: payload
    sizes of the members every window carries (text, images, values); `cameras`: (steps, bytes of one
    raw frame, or None for jpg / mp4 / av1 clips, whose size is unknown before encoding and counts 0).
    Every field has its mask (one byte per step); meta.json takes at least one block."""
    total = member_bytes(1) + sum(member_bytes(size) for size in static)
    for steps, width, itemsize in series:
        total += member_bytes(NPY_HEADER + steps * width * itemsize) + member_bytes(NPY_HEADER + steps)
    for steps, frame in cameras:
        if frame is not None:
            total += member_bytes(NPY_HEADER + steps * frame)
        total += member_bytes(NPY_HEADER + steps)
    return total


def source_bytes(data: EpisodeData) -> int:
    """Bytes of the episode's data in the store: streams as loaded, video files, static members."""
    total = sum(a.nbytes for a in data.streams.values()) + sum(len(t) for t in data.texts.values())
    total += sum(len(b) for b, _ in data.images.values()) + sum(v.nbytes for v in data.values.values())
    for video in data.videos.values():
        try:
            file = video["file"]  # a Path, or a StoreFile of a store in object storage (one HEAD)
            total += file.stat().st_size if isinstance(file, Path) else file.size()
        except (OSError, KeyError):
            pass
    return total
