"""Entry point of ``python -m spmd.inspector``."""

import sys

from spmd.inspector.cli import main

if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()
    sys.exit(main())
