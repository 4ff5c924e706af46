"""A run in flight: waiting for its outcome, with every output and the failure whole.

What GetRun leaves out to stay within its budget (outputs over 64 KiB, tasks past 10,000,
log tails) is fetched here, never dropped: a run's result holds every task's output, and
RunFailed carries the failed attempt's traceback and log tail.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from awp_sdk.enums import RunState, TaskState
from awp_sdk.errors import RunCanceled, RunFailed, WaitTimeout
from awp_sdk.records import Event, Run, RunDetail, SignalSent, TaskError, TaskStatus
from awp_sdk.streams import StreamItem

if TYPE_CHECKING:
    from awp_sdk.client import AsyncClient

# GetTaskOutput calls in flight at once while completing a run's outputs: each answer is
# at most 1 MiB, so this bounds the memory in transit as well as the load.
OUTPUT_FETCHES: Final = 8


async def complete_outputs(client: AsyncClient, detail: RunDetail) -> RunDetail:
    """The record with every task listed and every output in it: a run past GetRun's
    10,000 tasks is read whole with ListTasks (its tasks then as of that later read), and
    each output left out is fetched with GetTaskOutput."""
    tasks = detail.tasks
    if detail.tasks_omitted:
        tasks = {task.key: task async for task in client.list_tasks(detail.run.id)}
    lacking = [task for task in tasks.values() if task.output_omitted]
    if not lacking and tasks is detail.tasks:
        return detail
    gate = asyncio.Semaphore(OUTPUT_FETCHES)

    async def fetch(task: TaskStatus) -> TaskStatus:
        async with gate:
            output = await client.get_task_output(detail.run.id, task.key)
        return dataclasses.replace(task, output=output, output_omitted=False)

    fetched = await asyncio.gather(*(fetch(task) for task in lacking))
    whole = dict(tasks) | {task.key: task for task in fetched}
    return dataclasses.replace(detail, tasks=whole, tasks_omitted=0)


class AsyncRunHandle:
    """One run: its id, and how to wait for it, watch it or cancel it."""

    def __init__(
        self, client: AsyncClient, run_id: str, run: Run | None = None, created: bool = True
    ) -> None:
        self.client = client
        self.id = run_id
        # The run as StartRun answered (None for a handle made from an id).
        self.started = run
        # False when the request id had already started this run.
        self.created = created

    def __repr__(self) -> str:
        return f"<AsyncRunHandle {self.id}>"

    async def get(self, *, outputs: bool = True) -> RunDetail:
        return await self.client.get_run(self.id, outputs=outputs)

    # The same signature as RunHandle.result: one API, sync or async.
    async def result(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:  # noqa: ASYNC109
        """Waits for the run to end; returns each succeeded task's output by task key,
        every one of them whatever its size.

        Raises RunFailed (with the failed task, its error, traceback and log tail),
        RunCanceled, or WaitTimeout once `timeout` seconds pass (the run goes on).
        """
        try:
            async with asyncio.timeout(timeout) as scope:
                detail = await self.get(outputs=False)
                if not detail.run.done:
                    async for _ in self.watch(after_seq=detail.run.last_seq):
                        pass
                return await outcome(self.client, await self.get(outputs=False))
        except TimeoutError:
            # Only our own deadline is a WaitTimeout: a call's DeadlineExceeded stays one.
            if scope.expired():
                raise WaitTimeout(f"run {self.id} did not end within {timeout:g} s") from None
            raise

    async def watch(self, *, after_seq: int = 0) -> AsyncIterator[Event]:
        async for event in self.client.watch(self.id, after_seq=after_seq):
            yield event

    async def stream(self, task_key: str, *, from_offset: int = 0) -> AsyncIterator[StreamItem]:
        """The task's output stream (AsyncClient.task_stream)."""
        async for item in self.client.task_stream(self.id, task_key, from_offset=from_offset):
            yield item

    async def cancel(self, reason: str | None = None) -> Run:
        return await self.client.cancel(self.id, reason)

    async def signal(
        self, name: str, payload: Any = None, *, request_id: str | None = None
    ) -> SignalSent:
        """Sends this run a signal (AsyncClient.send_signal)."""
        return await self.client.send_signal(self.id, name, payload, request_id=request_id)


async def outcome(client: AsyncClient, detail: RunDetail) -> dict[str, dict[str, Any]]:
    """The outputs of a succeeded run, every one (those `detail` lacks are fetched);
    RunFailed or RunCanceled otherwise."""
    run = detail.run
    if run.state is RunState.CANCELED:
        raise RunCanceled(f"run {run.id} was canceled", run_id=run.id)
    if run.state is not RunState.FAILED:
        return (await complete_outputs(client, detail)).outputs()
    failed = first_failure(detail.tasks.values())
    if failed is None:
        raise RunFailed(
            f"run {run.id} failed",
            run_id=run.id,
            task_key=None,
            error=None,
            attempt=None,
            retryable=None,
        )
    error = failed.error
    # GetRun keeps log tails (and past its budget tracebacks) off its rows: the failed
    # task's last attempt, as ListAttempts gives it, has them.
    last = await last_attempt_error(client, run.id, failed.key)
    message = error.message if error is not None else "no error recorded"
    plural = "attempt" if failed.attempts == 1 else "attempts"
    raise RunFailed(
        f"run {run.id} failed: task {failed.key!r} failed after {failed.attempts} "
        f"{plural}: {message}",
        run_id=run.id,
        task_key=failed.key,
        error=error.message if error is not None else None,
        attempt=failed.attempts or None,
        retryable=error.retryable if error is not None else None,
        error_type=error.type if error is not None else None,
        traceback=(error.traceback if error is not None else None)
        or (last.traceback if last is not None else None),
        log_tail=last.log_tail if last is not None else None,
    )


async def last_attempt_error(client: AsyncClient, run_id: str, task_key: str) -> TaskError | None:
    """The error of the task's newest attempt, whole; None when it has no attempt (a map
    task, or one that failed before any ran)."""
    last = None
    async for attempt in client.list_attempts(run_id, task_key=task_key):
        last = attempt
    return last.error if last is not None else None


def first_failure(tasks: Iterable[TaskStatus]) -> TaskStatus | None:
    """The failed task that ended the run: the first to finish failing."""
    failed = [t for t in tasks if t.state is TaskState.FAILED]
    if not failed:
        return None
    latest = datetime.max.replace(tzinfo=UTC)
    return min(failed, key=lambda t: t.finished_at or latest)
