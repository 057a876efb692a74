"""`--storage-options`: how commands that take an fsspec URL (a store or an output at `s3://...`) get
the options the Python API takes as `storage_options=` (credentials, endpoint, ...), as in the reader.

Without it, fsspec and the cloud SDKs read their usual environment: `AWS_ACCESS_KEY_ID` /
`AWS_SECRET_ACCESS_KEY` / `AWS_PROFILE` / `AWS_ENDPOINT_URL` for s3, and fsspec's own config
(`FSSPEC_S3='{"anon": true}'`, or `FSSPEC_S3_ANON=true`: one variable per option)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from robowds.export.errors import UserError

EXAMPLE = '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}'


def add_storage_options_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-options", metavar="JSON",
                   help="fsspec options for s3:// (or gs://, ...) URLs, as a JSON object or @FILE holding one, "
                        f"e.g. '{EXAMPLE}' (default: the environment, e.g. AWS_PROFILE / AWS_ENDPOINT_URL)")


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed `--storage-options` ({} when not given); one UserError when it is not a JSON object."""
    text = getattr(args, "storage_options", None)
    if not text:
        return {}
    where = "--storage-options"
    if text.startswith("@"):
        where = f"--storage-options file {text[1:]}"
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{where} cannot be read: {exc}", hint="give a readable JSON file after @") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where} is not valid JSON: {exc}", hint=f"e.g. --storage-options '{EXAMPLE}'") from exc
    if not isinstance(value, dict):
        raise UserError(f"{where} must be a JSON object, got {type(value).__name__}",
                        hint=f"e.g. --storage-options '{EXAMPLE}'")
    return value
