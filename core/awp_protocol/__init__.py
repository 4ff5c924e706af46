"""The protocol's vocabulary, shared by server, worker, CLI and tests: limits, name
patterns, states, error reasons, JSON conversion. Pure: no I/O."""
