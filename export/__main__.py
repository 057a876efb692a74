"""`python -m robowds.export STORE OUT [options]` runs the export job (same as `robowds export`)."""

import sys

from robowds.export.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["export", *sys.argv[1:]]))
