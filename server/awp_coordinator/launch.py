"""awp-coordinator's entry point as installed: without the 'server' extra, one line saying what
to install instead of an import error from deep inside."""

from __future__ import annotations

import sys

from awp_common import extras


def main() -> None:
    problem = extras.SERVER.problem("awp-coordinator")
    if problem is not None:
        print(f"awp-coordinator: {problem}", file=sys.stderr)
        sys.exit(2)
    from awp_coordinator.main import main as run  # noqa: PLC0415 (only once the extra is there)

    run()
