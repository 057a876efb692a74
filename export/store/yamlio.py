"""Reading the user's YAML (export config, `--set` values, store.yaml) into plain Python values.

Why not bare `yaml.safe_load`: PyYAML follows YAML 1.1, where `1e-1`, `1e6` and `1.5e3` are strings
(1.1 floats need a dot and a signed exponent), so `--set window.duration_s=1e-1` was refused as "must
be a positive number, got '1e-1'". YAML 1.2 and every user read them as numbers: this loader adds the
exponent forms to the float resolver. And a file that is not text (a binary passed to `--config`) is
one `YamlError` naming the file, like a syntax error, instead of a UnicodeDecodeError.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class YamlError(ValueError):
    """Text that is not valid YAML, or a file that cannot be read as UTF-8 text; says where."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class _Loader(yaml.SafeLoader):
    """SafeLoader (no Python objects) that also reads exponent numbers without a dot as floats."""


# 1e-1, 1E6, +2.5e3, .5e-2, 1.5e3 (the 1.1 resolver already takes 1.5e-3, with a signed exponent)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_text(text: str, where: str) -> Any:
    """Parse YAML text; `where` names its origin in the error (a file, or `--set KEY=VALUE`)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise YamlError(where, f"not valid YAML: {' '.join(str(exc).split())}") from exc


def load_file(path: Path) -> Any:
    """Parse a YAML file; a file that is not UTF-8 text (e.g. binary) is a `YamlError`, not a crash.
    OSError (missing, a folder, unreadable) is left to the caller, which knows what the file is for."""
    return load_bytes(Path(path).read_bytes(), str(path))


def load_bytes(data: bytes, where: str) -> Any:
    """Parse a YAML file's bytes (read from a folder or object storage); `where` names the file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(where, f"not a YAML text file: byte {exc.start} ({data[exc.start:exc.start + 1]!r}) "
                        "is not UTF-8") from exc
    return load_text(text, where)
