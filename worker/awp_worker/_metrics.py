"""Prometheus metrics of one worker runtime (its own registry, so tests can run many)."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.claims = Counter(
            "awp_worker_claims", "Claim calls by result: leases, empty, draining, error",
            ["result"], registry=r,
        )  # fmt: skip
        self.empty_claims = Counter(
            "awp_worker_empty_claims", "Claim calls answered with no lease", registry=r
        )
        self.claimed_leases = Counter(
            "awp_worker_claimed_leases", "Leases received from Claim", registry=r
        )
        self.leases_held = Gauge(
            "awp_worker_leases_held", "Leases held now (running or being reported)", registry=r
        )
        self.executions = Counter(
            "awp_worker_executions",
            "Finished executions by kind and outcome: succeeded, failed, cancelled, "
            "safety_deadline",
            ["kind", "outcome"], registry=r,
        )  # fmt: skip
        self.execution_seconds = Histogram(
            "awp_worker_execution_seconds", "Execution wall time by kind", ["kind"], registry=r
        )
        self.completes = Counter(
            "awp_worker_complete_results",
            "Reported results by answer: accepted, duplicate, result_conflict, lease_lost, "
            "dropped (lease revoked before it was sent), rejected",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.complete_calls = Counter(
            "awp_worker_complete_calls", "Complete calls by result: ok, error", ["result"],
            registry=r,
        )  # fmt: skip
        self.complete_batch = Histogram(
            "awp_worker_complete_batch_size", "Results per Complete call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 500), registry=r,
        )  # fmt: skip
        self.revocations = Counter(
            "awp_worker_revocations", "Leases the server answered REVOKED or UNKNOWN",
            ["status"], registry=r,
        )  # fmt: skip
        self.safety_cancellations = Counter(
            "awp_worker_safety_deadline_cancellations",
            "Executions cancelled because their local safety deadline passed", registry=r,
        )  # fmt: skip
        self.memos_refused = Counter(
            "awp_worker_memos_refused",
            "Checkpoint calls refused LEASE_LOST (the attempt stopped)",
            registry=r,
        )
        self.heartbeats = Counter("awp_worker_heartbeats", "Heartbeat requests sent", registry=r)
        self.heartbeat_reconnects = Counter(
            "awp_worker_heartbeat_reconnects", "Heartbeat stream reconnects", registry=r
        )

    def serve(self, host: str, port: int) -> WSGIServer:
        """Serve /metrics on host:port from a daemon thread; ``shutdown()`` stops it."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
