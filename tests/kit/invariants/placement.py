"""The invariants of placement (docs/design.md §17, migration 0020), checked in every
committed state (committed.py) over the recorded lease history: each dispatch keeps its
worker, leased_at and finished_at (NULL while live), and each worker its labels and
capacities.

1. A dispatch carries exactly its task's placement (required and preferred labels,
   resources), copied when it was granted.
2. Required labels always honoured: every lease's worker had each required label and at
   least the units of each resource its task reserves (placement_fits).
3. Reservations never exceed a worker's capacity, at any instant: at each lease's start,
   the units of each of its resources reserved by the leases its worker held then
   (leased at or before it, not yet ended) are at most the worker's capacity. (A lease
   ended in a transaction the claim did not see ends after the claim's start, so it is
   counted: the check is exact for what the claim knew.)
4. Preference respected: a dispatch that preferred a worker (sticky, preferred labels)
   went to another worker only once its prefer_until had passed.
"""

from __future__ import annotations

from kit.invariants.common import Db


async def placement_problems(conn: Db) -> list[str]:
    problems = []
    for row in await conn.fetch(
        """SELECT d.id, t.key
             FROM dispatches d JOIN tasks t ON t.id = d.task_id
            WHERE (d.required_labels, d.preferred_labels, d.resource_names, d.resource_units)
                  IS DISTINCT FROM
                  (t.required_labels, t.preferred_labels, t.resource_names, t.resource_units)
            ORDER BY d.id LIMIT 10"""
    ):
        problems.append(
            f"dispatch {row['id']} of task {row['key']!r} does not carry its task's placement"
        )
    for row in await conn.fetch(
        """SELECT d.id, d.worker_id, d.required_labels, d.resource_names, d.resource_units,
                  w.placement_labels, w.resource_names AS capacity_names,
                  w.resource_units AS capacity_units
             FROM dispatches d JOIN workers w ON w.id = d.worker_id
            WHERE d.leased_at IS NOT NULL AND d.placed
              AND NOT placement_fits(d.required_labels, d.resource_names, d.resource_units,
                                     w.placement_labels, w.resource_names, w.resource_units)
            ORDER BY d.id LIMIT 10"""
    ):
        problems.append(
            f"dispatch {row['id']} (requires labels {list(row['required_labels'])}, resources "
            f"{dict(zip(row['resource_names'], row['resource_units'], strict=True))}) was "
            f"leased to worker {row['worker_id']} with labels {list(row['placement_labels'])} "
            f"and resources "
            f"{dict(zip(row['capacity_names'], row['capacity_units'], strict=True))}"
        )
    for row in await conn.fetch(
        """SELECT d.id, d.worker_id, r.name, held.units, c.units AS capacity
             FROM dispatches d
             CROSS JOIN LATERAL unnest(d.resource_names) AS r (name)
             JOIN workers w ON w.id = d.worker_id
             LEFT JOIN LATERAL (SELECT c.units FROM unnest(w.resource_names, w.resource_units)
                                    AS c (name, units) WHERE c.name = r.name) c ON true
             CROSS JOIN LATERAL (
                 SELECT sum(u.units) AS units
                   FROM dispatches e
                   CROSS JOIN LATERAL unnest(e.resource_names, e.resource_units) AS u (name, units)
                  WHERE e.worker_id = d.worker_id AND u.name = r.name
                    AND e.leased_at <= d.leased_at
                    AND (e.finished_at IS NULL OR e.finished_at > d.leased_at)) held
            WHERE d.leased_at IS NOT NULL AND cardinality(d.resource_names) > 0
              AND held.units > coalesce(c.units, 0)
            ORDER BY d.id LIMIT 10"""
    ):
        problems.append(
            f"worker {row['worker_id']}: when dispatch {row['id']} was leased, its leases "
            f"reserved {row['units']} of resource {row['name']!r}, over its capacity "
            f"{row['capacity'] or 0}"
        )
    for row in await conn.fetch(
        """SELECT d.id, d.worker_id, d.sticky_worker, d.preferred_labels, d.prefer_until,
                  d.leased_at
             FROM dispatches d JOIN workers w ON w.id = d.worker_id
            WHERE d.leased_at < d.prefer_until
              AND NOT placement_prefers(d.sticky_worker, d.preferred_labels, w.id,
                                        w.placement_labels)
            ORDER BY d.id LIMIT 10"""
    ):
        problems.append(
            f"dispatch {row['id']} preferred worker {row['sticky_worker']} / labels "
            f"{list(row['preferred_labels'])} until {row['prefer_until'].isoformat()} but "
            f"was leased to worker {row['worker_id']} at {row['leased_at'].isoformat()}"
        )
    return problems
