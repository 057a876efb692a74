"""The `robowds` command line: argument parsing and one handler per subcommand, plus the user tools
behind them (synthetic store, demo, inspect)."""

from robowds.export.cli.main import main

__all__ = ["main"]
