"""Client: the same API as AsyncClient for code without an event loop.

    with Client() as client:
        client.apply(wf)
        outputs = client.start(wf, input={"topic": "llamas"}).result(timeout=60)

It runs an AsyncClient on an event loop of its own, in a daemon thread: every method
hands its coroutine to that loop and waits, so a Client works the same from a script, a
web request handler or a notebook that already runs a loop. Ctrl-C while waiting cancels
the call in flight.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from awp_protocol.limits import MAX_PAGE_SIZE
from awp_sdk.client import AsyncClient, WorkflowLike
from awp_sdk.connection import Connection
from awp_sdk.enums import RunState
from awp_sdk.handle import AsyncRunHandle
from awp_sdk.records import (
    Applied,
    Attempt,
    Decided,
    Event,
    Identity,
    Page,
    Pruned,
    Run,
    RunDecision,
    RunDetail,
    SignalSent,
    Stats,
    StoredWorkflow,
    TaskPage,
    TaskStatus,
    Worker,
)
from awp_sdk.starts import RunRequest
from awp_sdk.streams import StreamItem
from awp_sdk.watch import GIVE_UP_AFTER_S, ReconnectHandler
from awp_sdk.workflow import Duration, Workflow

T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread, and a way to wait for coroutines on it."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="awp-sdk", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        async def step() -> T:
            return await anext(items)

        try:
            while True:
                try:
                    yield self.run(step())
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                self.run(close())

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class Client:
    """A connection to awp-server for synchronous code; see AsyncClient for the options
    (those left None come from the AWP_* environment)."""

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_server_name: str | None = None,
        timeout: float | None = None,
        connection: Connection | None = None,
    ) -> None:
        self._async = AsyncClient(
            address,
            token=token,
            token_file=token_file,
            tls=tls,
            tls_ca_file=tls_ca_file,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            tls_server_name=tls_server_name,
            timeout=timeout,
            connection=connection,
        )
        self.connection = self._async.connection
        self._loop: _LoopThread | None = _LoopThread()

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("this Client is closed")
        return self._loop.run(coroutine)

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        if self._loop is None:
            raise RuntimeError("this Client is closed")
        return self._loop.iterate(items)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run(self._async.close())
            self._loop.stop()
            self._loop = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply(self, workflow: WorkflowLike) -> Applied:
        """Stores the workflow version; the identical definition again is a no-op."""
        return self._run(self._async.apply(workflow))

    def start(
        self,
        workflow: Workflow | str,
        input: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
        version: int | None = None,
        start_at: datetime | None = None,
        start_in: timedelta | None = None,
        priority: int = 0,
    ) -> RunHandle:
        """Starts a run; see AsyncClient.start."""
        started = self._run(
            self._async.start(
                workflow,
                input,
                request_id=request_id,
                version=version,
                start_at=start_at,
                start_in=start_in,
                priority=priority,
            )
        )
        return RunHandle(self, started)

    def start_many(self, requests: Iterable[RunRequest]) -> list[RunHandle]:
        """Starts many runs in one call; see AsyncClient.start_many."""
        return [RunHandle(self, run) for run in self._run(self._async.start_many(requests))]

    def retry(
        self, run_id: str, *, from_task: str | None = None, request_id: str | None = None
    ) -> RunHandle:
        """A new run reusing what succeeded; see AsyncClient.retry."""
        return RunHandle(
            self, self._run(self._async.retry(run_id, from_task=from_task, request_id=request_id))
        )

    def run(self, run_id: str) -> RunHandle:
        """A handle on a run started elsewhere."""
        return RunHandle(self, self._async.run(run_id))

    # Each method below is AsyncClient's of the same name: see there.

    def get_workflow(self, name: str, version: int = 0) -> StoredWorkflow:
        return self._run(self._async.get_workflow(name, version))

    def list_workflows_page(
        self, *, name: str | None = None, page_size: int = 100, page_token: str = ""
    ) -> Page[StoredWorkflow]:
        return self._run(
            self._async.list_workflows_page(name=name, page_size=page_size, page_token=page_token)
        )

    def list_workflows(self, *, name: str | None = None) -> Iterator[StoredWorkflow]:
        return self._iterate(self._async.list_workflows(name=name))

    def get_run(self, run_id: str, *, outputs: bool = True) -> RunDetail:
        return self._run(self._async.get_run(run_id, outputs=outputs))

    def get_task_output(self, run_id: str, task_key: str) -> dict[str, Any] | None:
        return self._run(self._async.get_task_output(run_id, task_key))

    def list_tasks_page(
        self, run_id: str, *, page_size: int = MAX_PAGE_SIZE, page_token: str = ""
    ) -> TaskPage:
        return self._run(
            self._async.list_tasks_page(run_id, page_size=page_size, page_token=page_token)
        )

    def list_tasks(self, run_id: str) -> Iterator[TaskStatus]:
        return self._iterate(self._async.list_tasks(run_id))

    def list_attempts_page(
        self, run_id: str, *, task_key: str | None = None, page_token: str = ""
    ) -> Page[Attempt]:
        return self._run(
            self._async.list_attempts_page(run_id, task_key=task_key, page_token=page_token)
        )

    def list_attempts(self, run_id: str, *, task_key: str | None = None) -> Iterator[Attempt]:
        return self._iterate(self._async.list_attempts(run_id, task_key=task_key))

    def list_runs_page(
        self,
        *,
        workflow: str | None = None,
        state: RunState | str | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> Page[Run]:
        return self._run(
            self._async.list_runs_page(
                workflow=workflow, state=state, page_size=page_size, page_token=page_token
            )
        )

    def list_runs(
        self,
        *,
        workflow: str | None = None,
        state: RunState | str | None = None,
        page_size: int = 100,
    ) -> Iterator[Run]:
        return self._iterate(
            self._async.list_runs(workflow=workflow, state=state, page_size=page_size)
        )

    def cancel(self, run_id: str, reason: str | None = None) -> Run:
        return self._run(self._async.cancel(run_id, reason))

    def watch(
        self,
        run_id: str,
        *,
        after_seq: int = 0,
        give_up_after: float = GIVE_UP_AFTER_S,
        on_reconnect: ReconnectHandler | None = None,
    ) -> Iterator[Event]:
        return self._iterate(
            self._async.watch(
                run_id,
                after_seq=after_seq,
                give_up_after=give_up_after,
                on_reconnect=on_reconnect,
            )
        )

    def task_stream(
        self,
        run_id: str,
        task_key: str,
        *,
        from_offset: int = 0,
        give_up_after: float = GIVE_UP_AFTER_S,
        on_reconnect: ReconnectHandler | None = None,
    ) -> Iterator[StreamItem]:
        """The task's output stream from `from_offset` until it ends, resumed across
        reconnects."""
        return self._iterate(
            self._async.task_stream(
                run_id,
                task_key,
                from_offset=from_offset,
                give_up_after=give_up_after,
                on_reconnect=on_reconnect,
            )
        )

    def prune_runs(
        self, older_than: Duration, *, dry_run: bool = False, limit: int = 0, page_token: str = ""
    ) -> Pruned:
        return self._run(
            self._async.prune_runs(older_than, dry_run=dry_run, limit=limit, page_token=page_token)
        )

    def send_signal(
        self, run_id: str, name: str, payload: Any = None, *, request_id: str | None = None
    ) -> SignalSent:
        return self._run(self._async.send_signal(run_id, name, payload, request_id=request_id))

    def decisions(self, run_id: str, *, task_key: str | None = None) -> list[RunDecision]:
        return self._run(self._async.decisions(run_id, task_key=task_key))

    def approve(self, run_id: str, task_key: str, comment: str = "") -> Decided:
        return self._run(self._async.approve(run_id, task_key, comment))

    def reject(self, run_id: str, task_key: str, comment: str = "") -> Decided:
        return self._run(self._async.reject(run_id, task_key, comment))

    def list_workers(self, *, include_inactive: bool = False) -> tuple[Worker, ...]:
        return self._run(self._async.list_workers(include_inactive=include_inactive))

    def get_stats(self) -> Stats:
        return self._run(self._async.get_stats())

    def who_am_i(self) -> Identity:
        return self._run(self._async.who_am_i())


class RunHandle:
    """One run: its id, and how to wait for it, watch it or cancel it."""

    def __init__(self, client: Client, handle: AsyncRunHandle) -> None:
        self.client = client
        self._handle = handle
        self.id = handle.id
        self.started = handle.started
        self.created = handle.created

    def __repr__(self) -> str:
        return f"<RunHandle {self.id}>"

    def get(self, *, outputs: bool = True) -> RunDetail:
        return self.client._run(self._handle.get(outputs=outputs))

    def result(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Waits for the run to end; see AsyncRunHandle.result."""
        return self.client._run(self._handle.result(timeout))

    def watch(self, *, after_seq: int = 0) -> Iterator[Event]:
        return self.client._iterate(self._handle.watch(after_seq=after_seq))

    def stream(self, task_key: str, *, from_offset: int = 0) -> Iterator[StreamItem]:
        return self.client._iterate(self._handle.stream(task_key, from_offset=from_offset))

    def cancel(self, reason: str | None = None) -> Run:
        return self.client._run(self._handle.cancel(reason))

    def signal(
        self, name: str, payload: Any = None, *, request_id: str | None = None
    ) -> SignalSent:
        """Sends this run a signal (AsyncClient.send_signal)."""
        return self.client._run(self._handle.signal(name, payload, request_id=request_id))
