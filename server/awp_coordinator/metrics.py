"""Prometheus metrics of the coordinator, on a registry of its own so that several
coordinators can live in one process (tests, `awp dev`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from awp_coordinator.queue_gauges import QueueGauges


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # Read from the database by the leader (queue_gauges.refresh).
        self.queue = QueueGauges(self.registry)
        self.items = Counter(
            "awp_coordinator_items_total",
            "Items handled by coordinator passes, by kind of work",
            ["kind"],
            registry=self.registry,
        )
        self.passes = Counter(
            "awp_coordinator_passes_total", "Coordinator passes run", registry=self.registry
        )
        self.pass_errors = Counter(
            "awp_coordinator_pass_errors_total",
            "Coordinator passes that failed (retried at the next wake)",
            registry=self.registry,
        )
        self.pass_seconds = Histogram(
            "awp_coordinator_pass_seconds",
            "Duration of one coordinator pass",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.leader = Gauge(
            "awp_coordinator_leader",
            "1 while this process holds the leader lease",
            registry=self.registry,
        )
        self.leader_epoch = Gauge(
            "awp_coordinator_leader_epoch",
            "The epoch of the leader lease this process last acquired",
            registry=self.registry,
        )
        self.takeovers = Counter(
            "awp_coordinator_takeovers_total",
            "Leader leases this process took from another coordinator (expired or released)",
            registry=self.registry,
        )
        self.leadership_changes = Counter(
            "awp_coordinator_leadership_changes_total",
            "Leadership acquired or lost by this process",
            ["change"],
            registry=self.registry,
        )
        # Retention (awp_db.retention): what the leader deleted, and what it has yet to.
        self.retention_deleted = Counter(
            "awp_coordinator_retention_deleted_rows_total",
            "Rows retention deleted, by table",
            ["table"],
            registry=self.registry,
        )
        self.retention_backlog = Gauge(
            "awp_coordinator_retention_backlog_runs",
            "Finished runs past the retention age not deleted yet, as the leader last knew",
            registry=self.registry,
        )
