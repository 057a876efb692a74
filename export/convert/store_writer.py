"""Writing a converted store so that a killed conversion never leaves a store that validates but is
incomplete, and nothing robowds did not write is replaced.

The store is built in a sibling folder `.<name>.converting-<pid>` and renamed into place when complete;
`convert_report.json` marks a folder as robowds-written, and only such a folder is replaced by
`--overwrite` (renamed aside first, deleted after the new one is in place).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from robowds.export.errors import UserError

REPORT = "convert_report.json"


def write_store(store: Path, build: Callable[[Path], dict[str, Any]], overwrite: bool) -> dict[str, Any]:
    store = store.absolute()
    if store.exists():
        if not overwrite:
            raise UserError(f"store {store} already exists", hint="choose a new folder, or pass --overwrite to "
                                                                 "replace a store robowds convert wrote")
        if not (store / REPORT).is_file():
            raise UserError(f"store {store} was not written by robowds convert (no {REPORT}); not replacing it",
                            hint="choose a new folder (robowds never deletes what it did not write)")
    store.parent.mkdir(parents=True, exist_ok=True)
    for stale in store.parent.glob(f".{store.name}.converting-*"):  # left by a killed conversion
        shutil.rmtree(stale, ignore_errors=True)
    work = store.parent / f".{store.name}.converting-{os.getpid()}"
    work.mkdir()
    try:
        report = build(work)
        (work / REPORT).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        if store.exists():
            old = store.parent / f".{store.name}.replaced-{os.getpid()}"
            os.replace(store, old)
            os.replace(work, store)
            shutil.rmtree(old)
        else:
            os.replace(work, store)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return report
