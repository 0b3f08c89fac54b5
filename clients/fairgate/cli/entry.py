"""The `fairgate` program's entry point: a client-only install (no `cli` extra)
gets one line naming the extra instead of a traceback."""

from __future__ import annotations

import sys

from fairgate.cli.extras import missing_extra


def main() -> None:
    try:
        from fairgate.cli.main import main as cli_main
    except ModuleNotFoundError as exc:
        line = missing_extra(exc, "the fairgate command", "cli")
        if line is None:
            raise
        sys.stderr.write(f"error: {line} ('fairgate[server]' to serve)\n")
        sys.exit(1)
    cli_main()
