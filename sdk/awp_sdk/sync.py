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
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from awp_sdk.client import Applied, AsyncClient, AsyncRunHandle, WorkflowLike
from awp_sdk.connection import Connection
from awp_sdk.records import Event, Run, RunDetail, TaskStatus
from awp_sdk.streams import StreamItem
from awp_sdk.watch import GIVE_UP_AFTER_S
from awp_sdk.workflow import Workflow

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
    ) -> RunHandle:
        """Starts a run; see AsyncClient.start."""
        started = self._run(
            self._async.start(workflow, input, request_id=request_id, version=version)
        )
        return RunHandle(self, started)

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

    def get_run(self, run_id: str) -> RunDetail:
        return self._run(self._async.get_run(run_id))

    def list_tasks(self, run_id: str) -> Iterator[TaskStatus]:
        """Every task of the run, map elements included, a page at a time."""
        return self._iterate(self._async.list_tasks(run_id))

    def list_runs(
        self, *, workflow: str | None = None, state: str | None = None, page_size: int = 100
    ) -> Iterator[Run]:
        """Every run (of a workflow, in a state), newest first, a page at a time."""
        return self._iterate(
            self._async.list_runs(workflow=workflow, state=state, page_size=page_size)
        )

    def cancel(self, run_id: str, reason: str | None = None) -> Run:
        return self._run(self._async.cancel(run_id, reason))

    def watch(
        self, run_id: str, *, after_seq: int = 0, give_up_after: float = GIVE_UP_AFTER_S
    ) -> Iterator[Event]:
        """The run's events after `after_seq` until it ends, resumed across reconnects."""
        return self._iterate(
            self._async.watch(run_id, after_seq=after_seq, give_up_after=give_up_after)
        )

    def task_stream(
        self,
        run_id: str,
        task_key: str,
        *,
        from_offset: int = 0,
        give_up_after: float = GIVE_UP_AFTER_S,
    ) -> Iterator[StreamItem]:
        """The task's output stream from `from_offset` until it ends, resumed across
        reconnects."""
        return self._iterate(
            self._async.task_stream(
                run_id, task_key, from_offset=from_offset, give_up_after=give_up_after
            )
        )


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

    def get(self) -> RunDetail:
        return self.client._run(self._handle.get())

    def result(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Waits for the run to end; see AsyncRunHandle.result."""
        return self.client._run(self._handle.result(timeout))

    def watch(self, *, after_seq: int = 0) -> Iterator[Event]:
        return self.client._iterate(self._handle.watch(after_seq=after_seq))

    def stream(self, task_key: str, *, from_offset: int = 0) -> Iterator[StreamItem]:
        return self.client._iterate(self._handle.stream(task_key, from_offset=from_offset))

    def cancel(self, reason: str | None = None) -> Run:
        return self.client._run(self._handle.cancel(reason))
