"""The SDK's one typed view of the control API: every field of every ControlService
answer reaches its record, every enum maps both ways and refuses a number it does not
know, and every protocol reason has its error class."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import pytest
from google.protobuf import descriptor, duration_pb2, json_format, struct_pb2, timestamp_pb2
from google.protobuf.message import Message

from awp.v1 import control_pb2, durable_pb2, limits_pb2, runs_pb2, types_pb2
from awp_protocol.errors import Reason
from awp_sdk import decode, enums, errors, records, resumes
from awp_sdk.enums import RunState, TaskState

_counter = itertools.count(1001)


def filled(message: Message) -> Message:
    """`message` with every field set to a value of its own (texts and numbers unique)."""
    for field in message.DESCRIPTOR.fields:
        repeated = field.is_repeated
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            # A value of the map's own value type (map<string, int64> as much as of strings).
            value_field = field.message_type.fields_by_name["value"]
            getattr(message, field.name)[f"{field.name}-key"] = (
                f"{field.name}-value"
                if value_field.type == descriptor.FieldDescriptor.TYPE_STRING
                else _scalar(value_field)
            )
        elif field.message_type is not None:
            target = (
                getattr(message, field.name).add() if repeated else getattr(message, field.name)
            )
            _fill_message(target)
        else:
            value = _scalar(field)
            if repeated:
                getattr(message, field.name).append(value)
            else:
                setattr(message, field.name, value)
    return message


def _fill_message(target: Message) -> None:
    if isinstance(target, timestamp_pb2.Timestamp):
        target.seconds = next(_counter) * 1000
    elif isinstance(target, duration_pb2.Duration):
        target.seconds = next(_counter)
    elif isinstance(target, struct_pb2.Struct):
        target.update({"marker": f"struct-{next(_counter)}"})
    else:
        filled(target)


def _scalar(field: descriptor.FieldDescriptor) -> Any:
    if field.enum_type is not None:
        return 1  # the first real value: its decoding is tested below
    if field.type == descriptor.FieldDescriptor.TYPE_STRING:
        return f"{field.name}-{next(_counter)}"
    if field.type == descriptor.FieldDescriptor.TYPE_BOOL:
        return True
    if field.type in (
        descriptor.FieldDescriptor.TYPE_DOUBLE,
        descriptor.FieldDescriptor.TYPE_FLOAT,
    ):
        return 1.5
    return next(_counter)


def proto_leaves(message: Message) -> Iterator[Any]:
    """The texts, numbers, times and JSON values set in a message (bools and enums are
    not told apart this way)."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            yield from value.items()
            continue
        for item in values:
            if isinstance(item, timestamp_pb2.Timestamp):
                yield item.seconds
            elif isinstance(item, duration_pb2.Duration):
                yield float(item.seconds)
            elif isinstance(item, struct_pb2.Struct):
                yield item["marker"]
            elif isinstance(item, Message):
                yield from proto_leaves(item)
            elif field.enum_type is None and not isinstance(item, bool):
                yield item


def record_leaves(value: Any) -> Iterator[Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from record_leaves(getattr(value, field.name))
    elif isinstance(value, dict):
        yield from value.items()
        for item in value.values():
            yield from record_leaves(item)
    elif isinstance(value, tuple | list | frozenset):
        for item in value:
            yield from record_leaves(item)
    elif isinstance(value, datetime):
        yield int(value.timestamp())
    elif isinstance(value, timedelta):
        yield value.total_seconds()
    else:
        yield value


ANSWERS = [
    (runs_pb2.GetRunResponse, decode.run_detail),
    (runs_pb2.Run, decode.run),
    (runs_pb2.ListTasksResponse, decode.task_page),
    (runs_pb2.Attempt, decode.attempt),
    (types_pb2.StateEvent, decode.event),
    (control_pb2.Workflow, decode.workflow),
    (control_pb2.CreateWorkflowResponse, decode.applied),
    (control_pb2.WorkerInfo, decode.worker),
    (control_pb2.GetStatsResponse, decode.stats),
    (control_pb2.PruneRunsResponse, decode.pruned),
    (control_pb2.WhoAmIResponse, decode.identity),
    (durable_pb2.SendSignalResponse, decode.signal_sent),
    (durable_pb2.ApproveResponse, decode.decided),
    (durable_pb2.RejectResponse, decode.decided),
    (limits_pb2.ListRateLimitsResponse, decode.limits_overview),
]


@pytest.mark.parametrize(("kind", "read"), ANSWERS, ids=lambda x: getattr(x, "__name__", ""))
def test_every_field_of_an_answer_reaches_its_record(kind: type[Message], read: Any) -> None:
    message = filled(kind())
    if isinstance(message, types_pb2.StateEvent):
        message.type = types_pb2.EVENT_TYPE_TASK_STATE
    found = list(record_leaves(read(message)))
    lost = [leaf for leaf in proto_leaves(message) if leaf not in found]
    assert lost == [], f"{kind.__name__}: decode.py drops {lost}"


def test_the_flags_and_enums_of_a_task_are_read() -> None:
    task = runs_pb2.Task(
        key="fan[3]",
        state=types_pb2.TASK_STATE_WAITING_RETRY,
        attempts=5,
        hand_backs=2,
        output_omitted=True,
        map_parent="fan",
        map_index=3,
    )
    record = decode.task(task)
    assert (record.state, record.output_omitted, record.charged_attempts) == (
        TaskState.WAITING_RETRY,
        True,
        3,
    )
    assert (record.map_parent, record.map_index) == ("fan", 3)
    # Index 0 of a map is an index; a task that is no element has none.
    assert decode.task(runs_pb2.Task(key="fan[0]", state=1, map_parent="fan")).map_index == 0
    assert decode.task(runs_pb2.Task(key="plain", state=1)).map_index is None


def test_a_waiting_task_says_what_for_and_its_suspensions_are_free() -> None:
    task = runs_pb2.Task(
        key="review",
        state=types_pb2.TASK_STATE_WAITING,
        attempts=4,
        hand_backs=1,
        suspensions=2,
        wait=durable_pb2.TaskWait(
            kind=types_pb2.CHECKPOINT_KIND_APPROVAL,
            name="approval",
            prompt="Publish?",
            role="admin",
            since=timestamp_pb2.Timestamp(seconds=1_700_000_000),
            attempt=4,
        ),
        saved=types_pb2.MemoSavings(steps=2, tokens=1234, cost_usd=0.02),
    )
    record = decode.task(task)
    assert record.state is TaskState.WAITING
    assert record.charged_attempts == 1
    assert record.wait is not None
    assert (record.wait.kind, record.wait.name, record.wait.prompt, record.wait.role) == (
        enums.CheckpointKind.APPROVAL,
        "approval",
        "Publish?",
        "admin",
    )
    assert (record.wait.due_at, record.wait.attempt) == (None, 4)  # unset: never times out
    assert (record.saved.steps, record.saved.tokens, record.saved.cost_usd) == (2, 1234, 0.02)
    # The run's savings are its tasks' summed.
    other = dataclasses.replace(record, key="other", saved=records.MemoSavings(1, 100, 0.01))
    detail = records.RunDetail(decode.run(runs_pb2.Run(state=1)), {"a": record, "b": other}, ())
    assert detail.saved == records.MemoSavings(3, 1334, 0.03)
    # A task that waits for nothing has no wait, and saved nothing.
    plain = decode.task(runs_pb2.Task(key="plain", state=types_pb2.TASK_STATE_RUNNING))
    assert plain.wait is None
    assert not plain.saved


PAIRS = [
    (enums.RunState, types_pb2.RunState),
    (enums.TaskState, types_pb2.TaskState),
    (enums.AttemptState, types_pb2.AttemptState),
    (enums.CheckpointKind, types_pb2.CheckpointKind),
    (enums.DispatchState, types_pb2.DispatchState),
    (enums.WorkerState, types_pb2.WorkerState),
    (enums.EventType, types_pb2.EventType),
    (enums.FailurePolicy, types_pb2.FailurePolicy),
]


@pytest.mark.parametrize(("kind", "proto"), PAIRS, ids=lambda x: getattr(x, "__name__", ""))
def test_each_enum_maps_every_proto_value_both_ways(kind: type[StrEnum], proto: Any) -> None:
    # An event's UNSPECIFIED is sent (the server cannot name the type); any other enum's
    # is no value: where it means something (a subject just created), decode.py says what.
    sent = kind is enums.EventType
    numbers = [number for _, number in proto.items() if number != 0 or sent]
    assert [enums.decode(kind, number) for number in numbers] == list(kind)  # lifecycle order
    assert [enums.encode(kind, member) for member in kind] == numbers
    with pytest.raises(errors.UnknownEnumValue, match=r"value 99, which this version") as unknown:
        enums.decode(kind, 99)
    assert (unknown.value.enum, unknown.value.value) == (proto.DESCRIPTOR.full_name, 99)
    if not sent:
        with pytest.raises(errors.UnknownEnumValue):
            enums.decode(kind, 0)


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(errors.InvalidArgument, match="unknown RunState 'done': expected one"):
        enums.encode(RunState, "done")
    assert enums.encode(RunState, "FAILED") == types_pb2.RUN_STATE_FAILED


def test_a_state_compares_equal_to_its_name() -> None:
    assert RunState.FAILED == "failed" and {TaskState.SUCCEEDED: 1}["succeeded"] == 1
    assert f"{TaskState.WAITING_RETRY}" == "waiting_retry"


def test_an_event_of_a_newer_server_is_refused_not_misnamed() -> None:
    event = types_pb2.StateEvent(run_id="r", seq=1, type=types_pb2.EVENT_TYPE_TASK_STATE)
    event.task_transition.to_state = 42  # type: ignore[assignment]
    with pytest.raises(errors.UnknownEnumValue, match=r"awp\.v1\.TaskState value 42"):
        decode.event(event)


def test_every_protocol_reason_has_its_error_class() -> None:
    assert set(errors.BY_REASON) == set(Reason)
    assert errors.BY_REASON[Reason.RUN_NOT_FOUND] is errors.RunNotFound
    assert all(issubclass(kind, errors.AwpError) for kind in errors.BY_REASON.values())


def test_a_signal_s_payload_is_any_json_value_and_refused_before_sending_if_not_exact() -> None:
    for payload in (None, 3, "yes", [1, {"a": None}], {"paid": 12.5}):
        request = resumes.signal_request("r", "paid", payload, None)
        assert json_format.MessageToDict(request.payload) == payload
    assert resumes.signal_request("r", "paid", 1, "once").request_id == "once"
    with pytest.raises(errors.InvalidArgument) as refused:
        resumes.signal_request("r", "paid", {"amount": [1, 2**60]}, None)
    assert [v.field for v in refused.value.violations] == ["payload.amount[1]"]
    assert "2**53" in refused.value.message
    approve = resumes.decision("r", "review", "fine", approve=True)
    reject = resumes.decision("r", "review", "", approve=False)
    assert isinstance(approve, durable_pb2.ApproveRequest)
    assert isinstance(reject, durable_pb2.RejectRequest)
    assert (approve.task_key, approve.comment) == ("review", "fine")


def test_a_decision_is_read_from_the_event_that_records_it() -> None:
    at = datetime(2025, 1, 1, tzinfo=UTC)

    def event(payload: dict[str, Any], key: str | None = "review") -> records.Event:
        return records.Event(
            "r", 7, 5, enums.EventType.TASK_STATE, key, None, TaskState.WAITING,
            TaskState.READY, payload, at,
        )  # fmt: skip

    payload = {"approved": True, "decided_by": "ada", "comment": "go", "resumed_attempt": 2}
    assert resumes.decision_of(event(payload)) == records.RunDecision(
        "review", True, "ada", "go", 2, at
    )
    # A wait task resumes no attempt.
    rejected = resumes.decision_of(event({"approved": False, "decided_by": "root"}))
    assert rejected == records.RunDecision("review", False, "root", "", None, at)
    # Any other event records no decision.
    assert resumes.decision_of(event({"by": "alice"})) is None
    assert resumes.decision_of(event({"approved": "yes"})) is None
    assert resumes.decision_of(event(payload, key=None)) is None


def test_only_a_task_that_waits_waited_or_is_a_wait_asked_for_a_decision() -> None:
    plain = decode.task(
        runs_pb2.Task(key="a", state=types_pb2.TASK_STATE_SUCCEEDED, executor_kind="python")
    )
    assert not resumes.asked_for_decision(plain)
    assert resumes.asked_for_decision(dataclasses.replace(plain, suspensions=1))
    assert resumes.asked_for_decision(dataclasses.replace(plain, executor_kind=""))
