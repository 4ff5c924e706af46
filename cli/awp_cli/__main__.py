from __future__ import annotations

from awp_cli.main import main

main()
