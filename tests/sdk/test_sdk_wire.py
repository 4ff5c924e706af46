"""awp_sdk.wire prints a record as the protobuf JSON of the answer it was decoded from:
`awp ... --json` keeps the wire's shape while the CLI reads only records."""

from __future__ import annotations

from datetime import timedelta

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from awp.v1 import control_pb2, durable_pb2, runs_pb2, schedule_pb2, types_pb2
from awp_sdk import decode, wire
from awp_sdk.decode import message_json


def _at(seconds: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=1_700_000_000 + seconds, nanos=123_456_000)


def _struct(value: dict[str, object]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct


RUN = runs_pb2.Run(
    id="r1",
    workflow_name="w",
    workflow_version=2,
    state=types_pb2.RUN_STATE_RUNNING,
    revision=7,
    input=_struct({"n": 1, "s": "x", "f": 1.5, "l": [1, {"a": None}]}),
    request_id="once",
    created_at=_at(0),
    cancel_requested_at=_at(5),
    last_seq=9,
    tasks_by_state=[
        runs_pb2.TaskStateCount(state=types_pb2.TASK_STATE_SUCCEEDED, count=2),
        runs_pb2.TaskStateCount(state=types_pb2.TASK_STATE_FAILED, count=1),
    ],
    started_by="admin",
    cancel_requested_by="ops",
    retried_from_run_id="r0",
    retry_from_task="b",
    schedule_id="s1",
    schedule_tick=_at(-60),
    start_time=_at(30),
)
ERROR = types_pb2.TaskError(
    message="boom", retryable=True, type="ValueError", traceback="tb", log_tail="tail"
)


def test_a_run_with_its_tasks_and_attempts_prints_as_get_run_did() -> None:
    answer = runs_pb2.GetRunResponse(
        run=RUN,
        tasks=[
            runs_pb2.Task(
                key="a",
                state=types_pb2.TASK_STATE_SUCCEEDED,
                executor_kind="python",
                action="m:f",
                attempts=2,
                max_attempts=3,
                output=_struct({"ok": True}),
                error=ERROR,  # a success after a failed attempt keeps the old error
                finished_at=_at(3),
                hand_backs=1,
            ),
            runs_pb2.Task(
                key="b[0]",
                state=types_pb2.TASK_STATE_WAITING_RETRY,
                depends_on=["a"],
                retry_at=_at(4),
                map_parent="b",
                map_index=0,
                output_omitted=True,
                reused_from_run_id="r0",
            ),
            runs_pb2.Task(key="b[1]", state=types_pb2.TASK_STATE_READY, map_parent="b"),
            runs_pb2.Task(
                key="review",
                state=types_pb2.TASK_STATE_WAITING,
                attempts=3,
                suspensions=2,
                wait=durable_pb2.TaskWait(
                    kind=types_pb2.CHECKPOINT_KIND_APPROVAL,
                    name="approval",
                    prompt="Publish?",
                    role="admin",
                    since=_at(6),
                    due_at=_at(3600),
                    attempt=3,
                ),
                saved=types_pb2.MemoSavings(steps=2, tokens=1234, cost_usd=0.25),
            ),
            runs_pb2.Task(
                key="nap",
                state=types_pb2.TASK_STATE_WAITING,
                wait=durable_pb2.TaskWait(kind=types_pb2.CHECKPOINT_KIND_SLEEP, since=_at(7)),
            ),
        ],
        attempts=[
            runs_pb2.Attempt(
                task_key="a",
                attempt=1,
                state=types_pb2.ATTEMPT_STATE_INTERRUPTED,
                worker_id="w1",
                dispatch_id=11,
                fencing_token=12,
                started_at=_at(1),
                deadline=_at(60),
                finished_at=_at(2),
                error=types_pb2.TaskError(message="handed back"),
                worker_name="box",
            )
        ],
        attempts_omitted=1,
        tracebacks_omitted=2,
        tasks_omitted=3,
    )
    for task in answer.tasks:  # the server sends every task's savings, zeros included
        task.saved.SetInParent()
    assert wire.run_detail(decode.run_detail(answer)) == message_json(answer)
    listed = runs_pb2.ListTasksResponse(
        tasks=answer.tasks, next_page_token="t", tracebacks_omitted=4
    )
    page = decode.task_page(listed)
    assert wire.tasks(page.items, page.next_page_token, page.tracebacks_omitted) == message_json(
        listed
    )
    attempts = runs_pb2.ListAttemptsResponse(attempts=answer.attempts, next_page_token="n")
    decoded = tuple(map(decode.attempt, attempts.attempts))
    assert wire.attempts(decoded, "n") == message_json(attempts)


def test_signals_and_decisions_print_as_sent() -> None:
    sent = durable_pb2.SendSignalResponse(signal_id=42, delivered_to="review", duplicate=True)
    assert wire.signal_sent(decode.signal_sent(sent)) == message_json(sent)
    buffered = durable_pb2.SendSignalResponse(signal_id=43)
    assert wire.signal_sent(decode.signal_sent(buffered)) == message_json(buffered)
    approved = durable_pb2.ApproveResponse(
        task_state=types_pb2.TASK_STATE_READY, resumed_attempt=3, decided_at=_at(9)
    )
    assert wire.decided(decode.decided(approved)) == message_json(approved)
    rejected = durable_pb2.RejectResponse(
        task_state=types_pb2.TASK_STATE_FAILED, decided_at=_at(10)
    )
    assert wire.decided(decode.decided(rejected)) == message_json(rejected)


def test_runs_and_their_answers_print_as_sent() -> None:
    started = runs_pb2.StartRunResponse(run=RUN, created=True)
    assert wire.started(decode.run(RUN), True) == message_json(started)
    assert wire.run(decode.run(RUN)) == message_json(runs_pb2.CancelRunResponse(run=RUN))
    listed = runs_pb2.ListRunsResponse(runs=[RUN, RUN], next_page_token="p")
    assert wire.runs([decode.run(RUN)] * 2, "p") == message_json(listed)
    assert wire.runs([]) == {}


def test_every_kind_of_event_prints_as_sent() -> None:
    events = [
        types_pb2.StateEvent(
            run_id="r1",
            seq=1,
            revision=1,
            type=types_pb2.EVENT_TYPE_RUN_CREATED,
            payload=_struct({"workflow": "w", "version": 2}),
            created_at=_at(0),
        ),
        types_pb2.StateEvent(
            run_id="r1",
            seq=2,
            type=types_pb2.EVENT_TYPE_RUN_STATE,
            run_transition=types_pb2.RunTransition(
                from_state=types_pb2.RUN_STATE_RUNNING, to_state=types_pb2.RUN_STATE_FAILED
            ),
        ),
        types_pb2.StateEvent(
            run_id="r1",
            seq=3,
            type=types_pb2.EVENT_TYPE_TASK_STATE,
            task_key="a",
            task_transition=types_pb2.TaskTransition(to_state=types_pb2.TASK_STATE_PENDING),
        ),
        types_pb2.StateEvent(
            run_id="r1",
            seq=4,
            type=types_pb2.EVENT_TYPE_ATTEMPT_STATE,
            task_key="a",
            attempt=2,
            attempt_transition=types_pb2.AttemptTransition(
                from_state=types_pb2.ATTEMPT_STATE_RUNNING,
                to_state=types_pb2.ATTEMPT_STATE_TIMED_OUT,
            ),
        ),
        types_pb2.StateEvent(run_id="r1", seq=5, type=types_pb2.EVENT_TYPE_UNSPECIFIED),
    ]
    for event in events:
        assert wire.event(decode.event(event)) == message_json(event)


def test_workflows_workers_stats_and_prunes_print_as_sent() -> None:
    definition = types_pb2.WorkflowDefinition(
        name="w",
        version=3,
        description="d",
        concurrency=4,
        tasks=[
            types_pb2.TaskDefinition(
                key="a",
                executor_kind="python",
                action="m:f",
                input=_struct({"n": 2**40}),
                retry=types_pb2.RetryPolicy(
                    max_attempts=5,
                    initial_backoff=duration_pb2.Duration(seconds=1),
                    max_backoff=duration_pb2.Duration(seconds=30),
                    backoff_multiplier=2.0,
                ),
                timeout=duration_pb2.Duration(seconds=90),
            ),
            types_pb2.TaskDefinition(
                key="b",
                executor_kind="python",
                action="m:g",
                depends_on=["a"],
                map=types_pb2.TaskMap(over="a", path="items"),
                on_failure=types_pb2.FAILURE_POLICY_CONTINUE,
                always=True,
            ),
        ],
    )
    stored = control_pb2.Workflow(definition=definition, created_at=_at(0))
    assert wire.workflow(decode.workflow(stored)) == message_json(stored)
    applied = control_pb2.CreateWorkflowResponse(workflow=stored, created=True)
    assert wire.applied(decode.applied(applied)) == message_json(applied)
    listed = control_pb2.ListWorkflowsResponse(workflows=[stored], next_page_token="x")
    assert wire.workflows([decode.workflow(stored)], "x") == message_json(listed)

    worker = control_pb2.WorkerInfo(
        id="w1",
        name="box",
        state=types_pb2.WORKER_STATE_DRAINING,
        executor_kinds=["python", "mock"],
        max_concurrency=4,
        active_leases=1,
        labels={"zone": "a"},
        protocol_version=1,
        registered_at=_at(0),
        last_heartbeat_at=_at(1),
    )
    workers = control_pb2.ListWorkersResponse(workers=[worker])
    assert wire.workers([decode.worker(worker)]) == message_json(workers)

    answer = control_pb2.GetStatsResponse
    stats = answer(
        tasks_by_state=[
            answer.TaskCount(state=types_pb2.TASK_STATE_QUEUED, executor_kind="p", count=3)
        ],
        dispatches_by_state=[
            answer.DispatchCount(state=types_pb2.DISPATCH_STATE_LEASED, executor_kind="p", count=1)
        ],
        runs_by_state=[answer.RunCount(state=types_pb2.RUN_STATE_CANCELED, count=4)],
        workers_by_state=[answer.WorkerCount(state=types_pb2.WORKER_STATE_ACTIVE, count=5)],
        active_leases=1,
    )
    stats.oldest_pending.FromTimedelta(timedelta(seconds=7, milliseconds=250))
    assert wire.stats(decode.stats(stats)) == message_json(stats)

    pruned = control_pb2.PruneRunsResponse(
        runs=1,
        tasks=2,
        attempts=3,
        dispatches=4,
        events=5,
        remaining=6,
        cutoff=_at(0),
        next_page_token="more",
    )
    assert wire.pruned(decode.pruned(pruned)) == message_json(pruned)


def _schedule(**spec: object) -> schedule_pb2.Schedule:
    return schedule_pb2.Schedule(
        spec=schedule_pb2.ScheduleSpec(
            name="nightly",
            workflow_name="w",
            input=_struct({"n": 1}),
            timezone="Europe/Paris",
            overlap=schedule_pb2.OVERLAP_POLICY_BUFFER_ONE,
            catchup=schedule_pb2.CATCHUP_POLICY_LAST,
            catchup_window=duration_pb2.Duration(seconds=60),
            **spec,  # type: ignore[arg-type]
        ),
        id="s1",
        next_fire_time=_at(60),
        created_at=_at(0),
        created_by="admin",
        updated_at=_at(1),
        updated_by="ops",
    )


def test_schedules_and_their_answers_print_as_sent() -> None:
    cron = _schedule(cron="0 2 * * *", workflow_version=3)
    cron.recent_ticks.add(
        tick_time=_at(-60), source="schedule", outcome="started", run_id="r1", leader_epoch=4,
        created_at=_at(-59),
    )  # fmt: skip
    cron.recent_ticks.add(tick_time=_at(-120), source="trigger", outcome="skipped")
    every = _schedule(interval=duration_pb2.Duration(seconds=900), paused=True)
    every.ClearField("next_fire_time")
    for message in (cron, every):
        got = schedule_pb2.GetScheduleResponse(schedule=message)
        assert wire.schedule(decode.schedule(message)) == message_json(got)
    listed = schedule_pb2.ListSchedulesResponse(schedules=[cron, every])
    assert wire.schedules(map(decode.schedule, listed.schedules)) == message_json(listed)
    assert decode.schedule(every).cadence == "every 0:15:00"
    assert decode.schedule(cron).cadence == "0 2 * * * (Europe/Paris)"
    assert wire.schedule_deleted() == {}
    fired = schedule_pb2.BackfillScheduleResponse(run_ids=["r1", "r2"], already_fired=3)
    assert wire.backfilled(["r1", "r2"], 3) == message_json(fired)
    # TriggerSchedule's answer, from the run its tick started.
    triggered = schedule_pb2.TriggerScheduleResponse(run_id="r1", tick_time=_at(-60))
    assert wire.triggered(decode.run(RUN)) == message_json(triggered)
