"""The driver every converter shares: episodes converted in parallel, written in source order, published
whole.

A converter is a `Conversion`: its fields (known before any episode is read), one small picklable task
per episode, and a top-level function `convert(task, folder) -> row` that reads one episode from the
source, writes any media it makes under `folder/media/`, and returns the episode's row (see
`episode_store`; an optional `_notes` list of strings goes to the report's `notes`). The driver runs the tasks on the export's executor with `map_ordered` (a bounded
window of tasks in flight, results in task order), so the store's bytes are the same for any worker
count; it appends one Parquet row group per episode as rows arrive (memory: the window's rows, not the
dataset), and publishes through `store_writer` (a killed conversion leaves no store).

A task that raises `UserError` is one bad episode: the conversion stops with that message (naming the
episode and file), or with `skip_bad` goes on and lists it in the report. Anything else is a bug and
propagates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

from robowds.export.convert.episode_store import FieldSpec, arrow_table, store_yaml
from robowds.export.convert.store_writer import write_store
from robowds.export.errors import UserError
from robowds.export.executors.executor import LOCAL, ExecutorChoice
from robowds.export.progress import progress_bar

MAX_SKIPPED_LISTED = 5  # episodes named in the summary line; the report lists them all


@dataclass
class Conversion:
    """One converter's plan: what `run_conversion` needs, nothing read from episodes yet."""

    format: str  # "lerobot", "rlds", ...
    source: Path
    specs: list[FieldSpec]
    tasks: list[Any]  # one per episode, small and picklable (paths, indices)
    convert: Callable[[Any, Path], dict[str, Any]]  # top-level function (task, store folder) -> row
    describe: Callable[[Any], str]  # task -> "episode 3 (path/to/file)", for messages
    media_roots: list[Path] = field(default_factory=list)  # source folders referenced media live in
    yaml_extra: dict[str, Any] = field(default_factory=dict)  # top-level store.yaml keys (clock...)
    report: dict[str, Any] = field(default_factory=dict)  # format-specific report entries
    skipped: list[dict[str, Any]] = field(default_factory=list)  # episodes dropped before conversion
    files: dict[str, str] = field(default_factory=dict)  # more text files for the store folder (export.yaml)


@dataclass(frozen=True)
class _Task:
    convert: Callable[[Any, Path], dict[str, Any]]
    task: Any
    folder: Path
    skip_bad: bool


def _run_one(job: _Task) -> dict[str, Any] | UserError:
    """Runs in a worker: the row, or the episode's UserError when it is to be skipped (returned, not
    raised, so the other episodes go on)."""
    try:
        return job.convert(job.task, job.folder)
    except UserError as exc:
        if job.skip_bad:
            return exc
        raise


def run_conversion(conv: Conversion, store: Path, overwrite: bool = False, workers: int = 1, skip_bad: bool = False,
                   progress: bool = False, executor: ExecutorChoice = LOCAL) -> dict[str, Any]:
    """Convert every task of `conv` into a new store at `store`; returns the report (also written as
    `store/convert_report.json`). `executor` picks where the tasks run; the store's bytes are the same."""
    executor.check_available()  # before anything is written
    if not conv.tasks:
        raise UserError(f"{conv.source}: no episodes to convert"
                        + (f" ({len(conv.skipped)} skipped; the first: {_skipped(conv.skipped[0])})"
                           if conv.skipped else ""),
                        hint="check that SRC is the dataset's root folder and holds its data files")

    def build(folder: Path) -> dict[str, Any]:
        (folder / "media").mkdir()
        skipped, notes = list(conv.skipped), []
        writer, count = None, 0
        runner = executor.make(workers)
        try:
            runner.check_shared(folder, [conv.source, *conv.media_roots])  # tasks read these, write into folder
            jobs = (_Task(conv.convert, task, folder, skip_bad) for task in conv.tasks)
            results = runner.map_ordered(_run_one, jobs)
            for task, row in progress_bar(zip(conv.tasks, results), total=len(conv.tasks), desc="convert", unit="ep",
                                  disable=not progress):
                if isinstance(row, UserError):
                    skipped.append({"episode": conv.describe(task), "reason": row.message})  # the fix is the skip
                    continue
                notes.extend(row.pop("_notes", ()))
                table = arrow_table([row], conv.specs)
                if writer is None:
                    writer = pq.ParquetWriter(folder / "episodes.parquet", table.schema,
                                              use_dictionary=["episode_id"])  # floats: no dictionary (3x faster)
                writer.write_table(table)
                count += 1
        finally:
            runner.close()
            if writer is not None:
                writer.close()
        if count == 0:
            raise UserError(f"{conv.source}: every episode failed to convert; the first: {skipped[-1]['episode']}: "
                            f"{skipped[-1]['reason']}", hint="fix the source, or convert another dataset")
        (folder / "store.yaml").write_text(store_yaml(conv.specs, [str(r) for r in conv.media_roots],
                                                      f"written by robowds convert {conv.format}", conv.yaml_extra))
        for name, text in conv.files.items():  # inside the folder published whole, replaced with it
            (folder / name).write_text(text)
        return {"format": conv.format, "source": str(conv.source), "episodes": count, "skipped": skipped,
                "notes": notes,
                "fields": {s.name: {"source": s.source, "kind": s.kind, "dtype": s.dtype} for s in conv.specs},
                **conv.report}

    return write_store(Path(store), build, overwrite)


def _skipped(entry: dict[str, Any]) -> str:
    """One skipped episode as `episode ...: reason` (converters name it by description or by index)."""
    return f"{entry['episode'] if 'episode' in entry else 'episode ' + str(entry['episode_index'])}: {entry['reason']}"


def summary(report: dict[str, Any], store: Path, what: str) -> str:
    """The one line a convert command prints: counts, where, and the skipped episodes (first few)."""
    line = f"converted {report['episodes']} episodes of {what} ({len(report['fields'])} fields) -> {store}"
    skipped = report["skipped"]
    if skipped:
        named = "; ".join(_skipped(s) for s in skipped[:MAX_SKIPPED_LISTED])
        more = f"; and {len(skipped) - MAX_SKIPPED_LISTED} more" if len(skipped) > MAX_SKIPPED_LISTED else ""
        line += f"\nskipped {len(skipped)} (all listed in convert_report.json): {named}{more}"
    return line

