-- Placement (docs/workflows.md "Placement", docs/design.md §17): worker labels and
-- countable resources, task requirements and preferences, sticky runs.
--
-- A worker's placement labels ("key=value": its labels and "model=<name>" for each of
-- its models) and its capacity of each resource are fixed at Register. A task's
-- required and preferred labels, the units it reserves and whether it is sticky come
-- from its definition; the grant (awp_db.grant) copies them onto the dispatch it
-- creates, with the worker it prefers (sticky_worker: the run's most recent earlier
-- task's) and until when it prefers (prefer_until: NULL when no preferred worker was
-- active at the grant). A unit of a resource is held by each leased dispatch reserving
-- it, counted under the worker's session row lock at claim: no counter to give back,
-- so whatever ends a lease frees its units at that commit.
ALTER TABLE workers
    ADD COLUMN models text[] NOT NULL DEFAULT '{}',
    ADD COLUMN placement_labels text[] NOT NULL DEFAULT '{}',
    ADD COLUMN resource_names text[] NOT NULL DEFAULT '{}',
    ADD COLUMN resource_units bigint[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT workers_resources_aligned
        CHECK (cardinality(resource_names) = cardinality(resource_units));
ALTER TABLE tasks
    ADD COLUMN required_labels text[] NOT NULL DEFAULT '{}',
    ADD COLUMN preferred_labels text[] NOT NULL DEFAULT '{}',
    ADD COLUMN resource_names text[] NOT NULL DEFAULT '{}',
    ADD COLUMN resource_units bigint[] NOT NULL DEFAULT '{}',
    ADD COLUMN sticky boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT tasks_resources_aligned
        CHECK (cardinality(resource_names) = cardinality(resource_units));
ALTER TABLE dispatches
    ADD COLUMN required_labels text[] NOT NULL DEFAULT '{}',
    ADD COLUMN preferred_labels text[] NOT NULL DEFAULT '{}',
    ADD COLUMN resource_names text[] NOT NULL DEFAULT '{}',
    ADD COLUMN resource_units bigint[] NOT NULL DEFAULT '{}',
    ADD COLUMN sticky_worker uuid,
    ADD COLUMN prefer_until timestamptz,
    ADD CONSTRAINT dispatches_resources_aligned
        CHECK (cardinality(resource_names) = cardinality(resource_units)),
    -- Whether a claim must check the worker against it; the others take the plain path.
    ADD COLUMN placed boolean GENERATED ALWAYS AS (
        cardinality(required_labels) > 0 OR cardinality(resource_names) > 0
        OR prefer_until IS NOT NULL) STORED;
-- A claim asks, per run it locked, whether a pending dispatch there needs placement.
CREATE INDEX dispatches_pending_placed ON dispatches (run_id, id)
    WHERE state = 'pending' AND placed;
COMMENT ON COLUMN workers.placement_labels IS
    'Its labels as key=value and model=<name> per model: what required and preferred labels match.';
COMMENT ON COLUMN workers.resource_names IS
    'Countable resources (resource_units: capacity); its leased dispatches never reserve more.';
COMMENT ON COLUMN dispatches.resource_names IS
    'Units reserved (resource_units) on its worker while leased; freed when the lease ends.';
COMMENT ON COLUMN dispatches.prefer_until IS
    'Until then only its sticky worker / a worker with its preferred labels may lease it; NULL: anyone.';

-- The two rules of placement, written once and used by the grant, the claim, the
-- explanation and the withdrawal of unservable offers (awp_db.grant, awp_db.placement).
-- Whether a worker of these labels and capacities could ever run a task of these
-- requirements: it has every required label and at least the units of each resource.
CREATE FUNCTION placement_fits(required text[], names text[], units bigint[],
                               worker_labels text[], worker_names text[], worker_units bigint[])
    RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN required <@ worker_labels
       AND NOT EXISTS (SELECT 1 FROM unnest(names, units) AS n (name, units)
                        WHERE n.units > coalesce((SELECT c.units
                                                    FROM unnest(worker_names, worker_units) AS c (name, units)
                                                   WHERE c.name = n.name), 0));
-- Whether a worker is the one a dispatch prefers: its sticky worker (if it has one) and
-- having every preferred label.
CREATE FUNCTION placement_prefers(sticky_worker uuid, preferred text[], worker uuid,
                                  worker_labels text[])
    RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (sticky_worker IS NULL OR sticky_worker = worker) AND preferred <@ worker_labels;
COMMENT ON FUNCTION placement_fits(text[], text[], bigint[], text[], text[], bigint[]) IS
    'A worker of these labels and capacities could run a task of these requirements.';
COMMENT ON FUNCTION placement_prefers(uuid, text[], uuid, text[]) IS
    'The worker is the one a sticky / preferred-label dispatch prefers.';
