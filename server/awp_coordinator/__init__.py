"""awp-coordinator: dispatch with backpressure and fairness, reaping, cancellation and
offline detection, one active instance per database with standbys (DESIGN.md §7).

Nothing is imported here: `awp_coordinator.launch` must load without the 'server' extra
(awp_common.extras), to say it is missing."""
