from __future__ import annotations

from awp_coordinator.main import main

main()
