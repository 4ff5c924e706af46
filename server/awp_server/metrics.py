"""Prometheus metrics of awp-server (served on --metrics-listen)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CLAIMS = Counter("awp_claims_total", "Claim calls by outcome", ["outcome"])
# A Complete's claim (claim_max_leases) is not a Claim call: an empty one costs no call.
COMPLETE_CLAIMS = Counter(
    "awp_complete_claims_total", "Complete calls that claimed, by outcome", ["outcome"]
)
LEASES_ISSUED = Counter("awp_leases_issued_total", "Leases issued")
LEASE_ANSWERS = Counter(
    "awp_lease_heartbeat_answers_total", "Per-lease heartbeat answers", ["status"]
)
REVOCATIONS_PUSHED = Counter(
    "awp_lease_revocations_pushed_total",
    "Leases answered REVOKED on a heartbeat stream before the worker's next heartbeat",
)
COMPLETES = Counter("awp_complete_results_total", "Reported results by verdict", ["verdict"])
STREAM_APPENDS = Counter(
    "awp_stream_appends_total", "Output stream appends (AppendStream) by verdict", ["verdict"]
)
# LEASE_LOST: a stale attempt's memo refused (docs/design.md §16).
MEMO_WRITES = Counter(
    "awp_memo_writes_total", "Step memos recorded (RecordStep) by verdict", ["verdict"]
)
HEARTBEAT_STREAMS = Gauge("awp_heartbeat_streams_open", "Open heartbeat streams")
STREAMS_LOST = Counter(
    "awp_heartbeat_streams_lost_total", "Streams that broke without a drain (leases shortened)"
)
REGISTRATIONS = Counter("awp_worker_registrations_total", "Worker sessions registered")
HAND_BACKS = Counter(
    "awp_hand_backs_total",
    "Leases handed back by draining workers; charged=true: the task had no free one left",
    ["charged"],
)
RPCS = Counter("awp_rpcs_total", "Finished RPCs by method and status code", ["method", "code"])
RPC_LATENCY = Histogram(
    "awp_rpc_seconds",
    "Handler latency",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30),
)
DATABASE_UP = Gauge("awp_database_up", "1 when the last health probe reached PostgreSQL")
