"""Named credentials with roles: every RPC admits exactly its roles, unknown callers are
unauthenticated, the file is re-read when it changes, a client certificate can stand for
a credential, and every ControlService write names its caller (the audit trail)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
import yaml
from certs import client_leaf, server_leaf, write_ca

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, schedule_pb2, worker_pb2
from awp_common.tls import ClientTls, channel
from awp_protocol.errors import Reason, decode_details
from awp_protocol.roles import ROLES_OF, Role, file_entry, token_digest
from awp_server.credentials import CredentialsInvalid, CredentialStore, shorthand
from kit import ServerFactory, ServerHandle, poll_until, spec
from kit import start_run as db_start_run
from kit.db import converge_cancel

TOKENS = {role: f"token-of-{role}" for role in Role}
DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
# The policy of docs/security.md, written out independently of the server's table.
READS = (
    "GetWorkflow",
    "ListWorkflows",
    "GetRun",
    "GetTaskOutput",
    "ListAttempts",
    "ListRuns",
    "WatchRun",
    "WatchStream",
    "ListTasks",
    "ListWorkers",
    "GetStats",
    "GetSchedule",
    "ListSchedules",
    "GetRateLimit",
    "ListRateLimits",
)
# A schedule starts runs: managing one is a submitter's (docs/schedules.md).
SCHEDULE_WRITES = (
    "CreateSchedule",
    "UpdateSchedule",
    "PauseSchedule",
    "ResumeSchedule",
    "DeleteSchedule",
    "TriggerSchedule",
    "BackfillSchedule",
)
# A signal is input to a run, as starting it is; a decision is an approver's (§16).
DECISIONS = ("Approve", "Reject")
MAY_CALL = {
    Role.WORKER: {"Register", "WhoAmI"},
    Role.VIEWER: {*READS, "WhoAmI"},
    Role.SUBMITTER: {
        *READS,
        *SCHEDULE_WRITES,
        "WhoAmI",
        "StartRun",
        "StartRuns",
        "CancelRun",
        "RetryRun",
        "SendSignal",
    },
    Role.APPROVER: {*READS, *DECISIONS, "WhoAmI"},
    Role.ADMIN: {
        *DECISIONS,
        "SendSignal",
        *READS,
        *SCHEDULE_WRITES,
        "WhoAmI",
        "StartRun",
        "StartRuns",
        "CancelRun",
        "RetryRun",
        "CreateWorkflow",
        "Register",
        "PruneRuns",
        # A rate limit bounds every workflow's work (docs/workflows.md).
        "SetRateLimit",
    },
}


def credentials_file(path: Path, entries: list[dict[str, Any]]) -> str:
    path.write_text(yaml.safe_dump({"credentials": entries}))
    return str(path)


def one_per_role() -> list[dict[str, Any]]:
    return [file_entry(f"the-{role}", TOKENS[role], [role]) for role in Role]


@pytest.fixture
async def server(start_server: ServerFactory, tmp_path: Path) -> ServerHandle:
    path = credentials_file(tmp_path / "credentials.yaml", one_per_role())
    return await start_server(worker_token="", admin_token="", credentials_file=path)


async def call(address: str, method: str, token: str | None, scheme: str = "Bearer") -> Any:
    """Calls a method with an empty request; the status code and ErrorInfo reason."""
    metadata = (("authorization", f"{scheme} {token}"),) if token is not None else ()
    async with grpc.aio.insecure_channel(address) as chan:
        identity = {"request_serializer": None, "response_deserializer": None}
        try:
            if method.endswith("/WatchRun"):
                stream = chan.unary_stream(method, **identity)(b"", metadata=metadata, timeout=10)
                async for _ in stream:
                    break
            else:
                await chan.unary_unary(method, **identity)(b"", metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as error:
            return error.code(), decode_details(error.trailing_metadata()).reason
    return grpc.StatusCode.OK, ""


def test_every_control_rpc_and_register_has_its_roles() -> None:
    control = control_pb2.DESCRIPTOR.services_by_name["ControlService"]
    expected = {f"/awp.v1.ControlService/{m.name}" for m in control.methods}
    expected.add("/awp.v1.WorkerService/Register")
    assert set(ROLES_OF) == expected


@pytest.mark.parametrize("method", sorted(ROLES_OF))
async def test_each_role_may_make_exactly_its_calls(server: ServerHandle, method: str) -> None:
    for role, token in TOKENS.items():
        code, reason = await call(server.address, method, token)
        if method.rsplit("/", 1)[-1] in MAY_CALL[role]:
            # Past the check: the empty request is the handler's to judge.
            assert code not in DENIED, (role, method, code)
        else:
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED)
    assert (await call(server.address, method, "not-a-token"))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert (await call(server.address, method, None))[0] == grpc.StatusCode.UNAUTHENTICATED


async def test_who_am_i_names_the_callers_credential_and_roles(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    entries = [*one_per_role(), file_entry("ops", "token-of-ops", [Role.VIEWER, Role.SUBMITTER])]
    server = await start_server(
        worker_token="",
        admin_token="",
        credentials_file=credentials_file(tmp_path / "credentials.yaml", entries),
    )
    async with server.channel() as chan:
        stub = control_pb2_grpc.ControlServiceStub(chan)
        request = control_pb2.WhoAmIRequest()
        for token, name, roles in [
            *((TOKENS[role], f"the-{role}", [str(role)]) for role in Role),
            ("token-of-ops", "ops", ["submitter", "viewer"]),
        ]:
            answer = await stub.WhoAmI(request, metadata=(("authorization", f"Bearer {token}"),))
            assert (answer.name, list(answer.roles), answer.credentials_required) == (
                name,
                roles,
                True,
            )
    open_server = await start_server(worker_token="", admin_token="", insecure=True)
    async with open_server.channel() as chan:
        answer = await control_pb2_grpc.ControlServiceStub(chan).WhoAmI(request)
    assert (answer.name, list(answer.roles), answer.credentials_required) == (
        "anonymous",
        sorted(Role),
        False,
    )


async def test_the_bearer_scheme_is_matched_without_regard_to_case(server: ServerHandle) -> None:
    method = "/awp.v1.ControlService/ListWorkflows"
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert await call(server.address, method, TOKENS[Role.VIEWER], scheme) == (
            grpc.StatusCode.OK,
            "",
        )


async def test_the_credentials_file_is_read_again_when_it_changes(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    path = tmp_path / "credentials.yaml"
    credentials_file(path, [file_entry("old", "old-token", [Role.VIEWER])])
    server = await start_server(worker_token="", admin_token="", credentials_file=str(path))
    method = "/awp.v1.ControlService/ListRuns"
    assert (await call(server.address, method, "old-token"))[0] == grpc.StatusCode.OK
    # Rotation: the new key in, the old one out.
    credentials_file(path, [file_entry("new", "new-token", [Role.VIEWER])])

    async def rotated() -> bool:
        return (await call(server.address, method, "new-token"))[0] == grpc.StatusCode.OK

    await poll_until(rotated, within=10)
    assert (await call(server.address, method, "old-token"))[0] == grpc.StatusCode.UNAUTHENTICATED
    # A broken file keeps the credentials that work.
    path.write_text("credentials: [{name: broken}]")
    await asyncio.sleep(0)  # the next call sees the new mtime; nothing to wait for
    assert await rotated()


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        (
            [file_entry("a", "same", [Role.VIEWER]), file_entry("b", "same", [Role.ADMIN])],
            "is also credential 'a'",
        ),
        (shorthand("same", "same"), "is also credential 'worker'"),
        ([{"name": "x", "token_sha256": "0" * 64, "roles": ["root"]}], "unknown role"),
        ([{"name": "x", "roles": ["viewer"]}], "exactly one of token_sha256"),
        ([], "no credentials"),
    ],
)
def test_a_credential_set_that_cannot_be_used_is_refused(
    tmp_path: Path, entries: list[dict[str, Any]], problem: str
) -> None:
    path = credentials_file(tmp_path / "credentials.yaml", entries)
    with pytest.raises(CredentialsInvalid, match=problem):
        CredentialStore(path, [])


async def test_a_client_certificate_stands_for_its_credential(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca_file = write_ca(ca, tmp_path / "ca.pem")
    served = server_leaf(ca, tmp_path)
    path = credentials_file(
        tmp_path / "credentials.yaml",
        [{"name": "fleet", "certificate_common_name": "fleet-worker", "roles": ["worker"]}],
    )
    server = await start_server(
        worker_token="",
        admin_token="",
        credentials_file=path,
        tls_cert_file=served.cert,
        tls_key_file=served.key,
        tls_client_ca_file=ca_file,
    )

    async def register(common_name: str) -> grpc.StatusCode:
        pem = client_leaf(ca, tmp_path, common_name)
        async with channel(server.address, ClientTls(True, ca_file, pem.cert, pem.key)) as chan:
            stub = control_pb2_grpc.ControlServiceStub(chan)
            try:
                await stub.ListRuns(runs_pb2.ListRunsRequest(), timeout=10)
            except grpc.aio.AioRpcError as error:
                listed = error.code()
            else:
                listed = grpc.StatusCode.OK
            assert listed in DENIED  # a worker's certificate is no viewer
            register = chan.unary_unary(
                "/awp.v1.WorkerService/Register",
                request_serializer=worker_pb2.RegisterRequest.SerializeToString,
                response_deserializer=worker_pb2.RegisterResponse.FromString,
            )
            request = worker_pb2.RegisterRequest(
                name="cert-worker", protocol_version=1, executor_kinds=["mock"], max_concurrency=1
            )
            try:
                await register(request, timeout=10)
            except grpc.aio.AioRpcError as error:
                return error.code()
        return grpc.StatusCode.OK

    assert await register("fleet-worker") == grpc.StatusCode.OK
    assert await register("someone-else") == grpc.StatusCode.UNAUTHENTICATED


async def test_control_writes_record_their_caller(
    server: ServerHandle, pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awp.audit")
    run_id = await db_start_run(pool, spec("audited", 1))
    async with grpc.aio.insecure_channel(server.address) as chan:
        stub = control_pb2_grpc.ControlServiceStub(chan)

        def auth(role: Role) -> tuple[tuple[str, str], ...]:
            return (("authorization", f"Bearer {TOKENS[role]}"),)

        created = await stub.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(
                definition=(
                    await stub.GetWorkflow(
                        control_pb2.GetWorkflowRequest(name="audited"), metadata=auth(Role.VIEWER)
                    )
                ).workflow.definition
            ),
            metadata=auth(Role.ADMIN),
        )
        assert not created.created  # the same definition again: idempotent
        started = await stub.StartRun(
            runs_pb2.StartRunRequest(workflow_name="audited"), metadata=auth(Role.SUBMITTER)
        )
        assert started.run.started_by == f"the-{Role.SUBMITTER}"
        canceled = await stub.CancelRun(
            runs_pb2.CancelRunRequest(run_id=started.run.id, reason="audit"),
            metadata=auth(Role.ADMIN),
        )
        assert canceled.run.cancel_requested_by == f"the-{Role.ADMIN}"
        request = control_pb2.PruneRunsRequest()
        request.older_than.FromSeconds(86400)
        await stub.PruneRuns(request, metadata=auth(Role.ADMIN))
    events = await pool.fetch(
        "SELECT type, payload->>'by' AS by FROM state_events WHERE run_id = $1::uuid "
        "AND type IN ('run.created', 'run.cancel_requested') ORDER BY seq",
        started.run.id,
    )
    assert [(e["type"], e["by"]) for e in events] == [
        ("run.created", f"the-{Role.SUBMITTER}"),
        ("run.cancel_requested", f"the-{Role.ADMIN}"),
    ]
    assert run_id  # the workflow existed before the calls above
    audit = [(r.call, r.by) for r in caplog.records if r.name == "awp.audit"]  # type: ignore[attr-defined]
    assert audit == [
        ("CreateWorkflow", f"the-{Role.ADMIN}"),
        ("StartRun", f"the-{Role.SUBMITTER}"),
        ("CancelRun", f"the-{Role.ADMIN}"),
        ("PruneRuns", f"the-{Role.ADMIN}"),
    ]


async def test_a_retry_records_its_caller(
    server: ServerHandle, pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awp.audit")
    source = await db_start_run(pool, spec("retried", 1))
    await converge_cancel(pool, source)  # finished: it may be retried
    async with grpc.aio.insecure_channel(server.address) as chan:
        stub = control_pb2_grpc.ControlServiceStub(chan)
        retried = await stub.RetryRun(
            runs_pb2.RetryRunRequest(run_id=str(source)),
            metadata=(("authorization", f"Bearer {TOKENS[Role.SUBMITTER]}"),),
        )
        got = await stub.GetRun(
            runs_pb2.GetRunRequest(run_id=retried.run.id),
            metadata=(("authorization", f"Bearer {TOKENS[Role.VIEWER]}"),),
        )
    assert (got.run.started_by, got.run.retried_from_run_id) == (
        f"the-{Role.SUBMITTER}",
        str(source),
    )
    created = await pool.fetchrow(
        "SELECT payload FROM state_events WHERE run_id = $1::uuid AND type = 'run.created'",
        retried.run.id,
    )
    assert created["payload"]["by"] == f"the-{Role.SUBMITTER}"
    audit = [
        (r.call, r.by, r.retried_from)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "awp.audit"
    ]
    assert audit == [("RetryRun", f"the-{Role.SUBMITTER}", str(source))]


def test_minted_tokens_are_the_ones_their_file_entries_grant(tmp_path: Path) -> None:
    path = tmp_path / "credentials.yaml"
    awp = [sys.executable, "-m", "awp_cli", "credentials", "mint", "--file", str(path)]
    tokens = {
        name: subprocess.run(
            [*awp, "--name", name, "--role", role],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        for name, role in (("fleet", "worker"), ("ops", "admin"))
    }
    known = CredentialStore(str(path), []).current()
    for name, role in (("fleet", Role.WORKER), ("ops", Role.ADMIN)):
        credential = known.by_digest[token_digest(tokens[name])]
        assert (credential.name, credential.roles) == (name, frozenset({role}))
    assert tokens["fleet"] not in path.read_text()  # only hashes are stored


async def test_schedule_changes_record_their_caller(
    server: ServerHandle, pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awp.audit")
    await db_start_run(pool, spec("scheduled", 1))  # the workflow
    async with grpc.aio.insecure_channel(server.address) as chan:
        stub = control_pb2_grpc.ControlServiceStub(chan)
        submitter = (("authorization", f"Bearer {TOKENS[Role.SUBMITTER]}"),)
        created = await stub.CreateSchedule(
            schedule_pb2.CreateScheduleRequest(
                schedule=schedule_pb2.ScheduleSpec(
                    name="nightly", workflow_name="scheduled", cron="0 2 * * *"
                )
            ),
            metadata=submitter,
        )
        assert created.schedule.created_by == f"the-{Role.SUBMITTER}"
        triggered = await stub.TriggerSchedule(
            schedule_pb2.TriggerScheduleRequest(name="nightly"), metadata=submitter
        )
        await stub.DeleteSchedule(
            schedule_pb2.DeleteScheduleRequest(name="nightly"), metadata=submitter
        )
    by = await pool.fetchval("SELECT started_by FROM runs WHERE id = $1::uuid", triggered.run_id)
    assert by == f"the-{Role.SUBMITTER}"
    audit = [(r.call, r.by, r.schedule) for r in caplog.records if r.name == "awp.audit"]  # type: ignore[attr-defined]
    assert audit == [
        ("CreateSchedule", f"the-{Role.SUBMITTER}", "nightly"),
        ("TriggerSchedule", f"the-{Role.SUBMITTER}", "nightly"),
        ("DeleteSchedule", f"the-{Role.SUBMITTER}", "nightly"),
    ]
