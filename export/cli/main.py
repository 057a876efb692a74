"""The `robowds` command: synth, validate, export, verify, inspect, demo.

One module per subcommand (`<name>_cmd.py`: its arguments and its handler); this one builds the parser
and turns user errors into one message (what, where, how to fix) and a non-zero exit; tracebacks are
for bugs.
"""

from __future__ import annotations

import argparse
import sys

from robowds.export.cli import demo_cmd, export_cmd, inspect_cmd, synth_cmd, validate_cmd, verify_cmd
from robowds.export.errors import UserError

COMMANDS = (synth_cmd, validate_cmd, export_cmd, verify_cmd, inspect_cmd, demo_cmd)  # in help order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robowds", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except UserError as exc:
        print(f"robowds {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a path the user gave: missing, a folder, read-only, disk full (export wraps its own)
        from robowds.export.job.oserrors import os_error

        error = os_error(exc, args.command)
        print(f"robowds {args.command}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"robowds {args.command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
