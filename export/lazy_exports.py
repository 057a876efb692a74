"""Package attributes imported on first use (PEP 562 `__getattr__`), for packages whose `__init__`
re-exports names from heavy submodules.

Why: importing any submodule runs its package's `__init__` first. A `verify --workers` pool worker
needs only `robowds.export.store.location` (a StoreLocation in its task), but the store package's
`__init__` imported its schema (pyarrow), declarations (yaml) and validation: ~0.4 s of CPU before the
worker's first shard on the 2-core VM (docs/benchmark-runs/verify.md). With this, `from
robowds.export.store import open_store` still works and costs what it did; `import
robowds.export.store.location` costs only that module.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `name` from its submodule `where[name]` on
    first access and keeps it in the package's namespace (later accesses are plain lookups)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
