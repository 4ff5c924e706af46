"""awp-coordinator: dispatch with backpressure and fairness, reaping, cancellation and
offline detection, one active instance per database with standbys (DESIGN.md §7)."""

from __future__ import annotations

from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.coordinator import Coordinator, PassReport

__all__ = ["Coordinator", "CoordinatorConfig", "PassReport"]
