"""The `robowds` command: synth, validate, export, verify, inspect, report, demo.

One module per subcommand (`<name>_cmd.py`: its arguments and its handler); this one builds the parser
and turns user errors into one message (what, where, how to fix) and a non-zero exit; tracebacks are
for bugs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from robowds.export import __version__
from robowds.export.cli import (convert, demo_cmd, export_cmd, inspect_cmd, report_cmd, synth_cmd, validate_cmd,
                                verify_cmd)
from robowds.export.errors import UserError

COMMANDS = (convert, synth_cmd, validate_cmd, export_cmd, verify_cmd, inspect_cmd, report_cmd, demo_cmd)  # help order


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a command whose reader went away


class DefaultsShown(argparse.HelpFormatter):
    """Each option's help ends with its default, unless the default says nothing (None, False, []) or
    the help already tells it in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        says_nothing = action.default is None or action.default is False or action.default == []  # not 0
        silent = says_nothing or action.default == argparse.SUPPRESS or "default" in text
        return text if silent or not action.option_strings else text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (`--fps abc`, an unknown option) take the shape of every
    user error: one `PROG: error:` line and one `fix:` line (argparse prints its usage block first).
    Sub-command parsers are of this class too (`add_subparsers` makes them of the parent's type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n  fix: `{self.prog} --help` lists every option and "
                     "the values it takes\n")


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(command.__name__.rsplit(".", 1)[1].removesuffix("_cmd") for command in COMMANDS)
    parser = Parser(prog="robowds", description=f"Robot episodes -> resampled, padded WebDataset "
                                     f"windows. Commands: {names}; `robowds COMMAND --help` for each one's options.")
    parser.add_argument("--version", action="version", version=f"robowds {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    for command_parser in _parsers(parser):
        command_parser.formatter_class = DefaultsShown
    return parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every sub-command's parser, nested ones (`convert FORMAT`) included."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                out += [child, *_parsers(child)]
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit where it cannot be caught
        return code
    except BrokenPipeError:  # `robowds validate STORE -v | head -2`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own exit-time flush must not raise again
        return EXIT_BROKEN_PIPE
    except UserError as exc:
        print(f"robowds {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a path the user gave: missing, a folder, read-only, disk full (export wraps its own)
        from robowds.export.output.oserrors import os_error

        error = os_error(exc, args.command)
        print(f"robowds {args.command}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"robowds {args.command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
