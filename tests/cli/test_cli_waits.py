"""Signals and approvals by the command line, end to end against a real awp-server with
named credentials (a raw worker brings a task to its wait): `awp run get` shows what the
task waits for; a viewer's `awp approve` is refused; `awp signal send` keeps a signal no
task waits for yet, once per request id, and a finished run refuses one; an approver's
`awp approve` resumes the task, once, and the decision with its comment is the run's
audit trail in `awp run get` and the server's audit log."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from awp.v1 import checkpoints_pb2, session_pb2, types_pb2, worker_pb2_grpc
from awp_db.connect import Pool
from awp_protocol.roles import Role, file_entry
from cli.runner import Result, awp_async
from kit import ServerFactory, ServerHandle, spec
from kit.db import dispatch_all
from kit.rawworker import leased

TOKENS = {"ada": "token-of-ada", "victor": "token-of-victor", "alice": "token-of-alice"}
ROLES = {"ada": Role.APPROVER, "victor": Role.VIEWER, "alice": Role.SUBMITTER}
PROMPT = "Ship the release notes?"


@pytest.fixture
async def server(start_server: ServerFactory, tmp_path: Path) -> ServerHandle:
    path = tmp_path / "credentials.yaml"
    entries = [file_entry(name, TOKENS[name], [ROLES[name]]) for name in TOKENS]
    path.write_text(yaml.safe_dump({"credentials": entries}))
    return await start_server(credentials_file=str(path))


async def as_user(server: ServerHandle, user: str, *args: str) -> Result:
    return await awp_async(*args, env={"AWP_ADDRESS": server.address, "AWP_TOKEN": TOKENS[user]})


async def test_an_approval_by_the_command_line_resumes_the_task_and_is_audited(
    server: ServerHandle, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awp.audit")
    async with server.channel() as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
        waited = await worker.stub.Await(
            checkpoints_pb2.AwaitRequest(
                session=worker.session,
                dispatch_id=lease.dispatch_id,
                lease_token=lease.lease_token,
                kind=types_pb2.CHECKPOINT_KIND_APPROVAL,
                name="approval",
                prompt=PROMPT,
            ),
            timeout=30,
        )
        assert waited.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED
        run = str(run_id)

        shown = await as_user(server, "victor", "run", "get", run)
        assert shown.code == 0, shown.err
        # The suspended attempt is free: 0 of 3 charged.
        assert re.search(r"t0\s+waiting\s.*0/3 \+1 suspended\s.*waits for approval", shown.out)
        assert re.search(
            rf"t0\s+approval 'approval' by approvers or admins\s.*never\s+1\s+{PROMPT}", shown.out
        ), shown.out

        refused = await as_user(server, "victor", "approve", run, "t0")
        assert refused.code == 2
        assert refused.err.startswith("awp: PERMISSION_DENIED: "), refused.err

        kept = await as_user(
            server, "alice", "signal", "send", run, "later", "--payload", '{"n": 1}',
            "--request-id", "s1",
        )  # fmt: skip
        assert kept.code == 0, kept.err
        assert f"is kept until a task of run {run} waits for it" in kept.out
        again = await as_user(
            server, "alice", "signal", "send", run, "later", "--request-id", "s1", "--json"
        )
        assert again.code == 0 and again.json()["duplicate"] is True

        approved = await as_user(server, "ada", "approve", run, "t0", "--comment", "ship it")
        assert approved.code == 0, approved.err
        assert f"approved task t0 of run {run}, resuming attempt 1: it is ready" in approved.out
        twice = await as_user(server, "ada", "approve", run, "t0")
        assert twice.code == 2 and twice.err.startswith("awp: NOT_WAITING: "), twice.err
        assert "hint: awp run get RUN shows which tasks wait, and for what" in twice.err

        final = await as_user(server, "victor", "run", "get", run)
        assert re.search(
            r"t0  approved by ada at [-0-9: ]+, resuming attempt 1: 'ship it'", final.out
        ), final.out
        assert "\nwaiting\n" not in final.out  # nothing waits any more
        # The server's audit log: who decided what, with the comment and the attempt.
        (line,) = [r for r in caplog.records if getattr(r, "call", "") == "Approve"]
        assert (line.by, line.run_id, line.task_key, line.comment, line.resumed_attempt) == (  # type: ignore[attr-defined]
            "ada",
            run,
            "t0",
            "ship it",
            1,
        )

        # The task runs again and the run ends: it takes no signal any more.
        await dispatch_all(pool)
        (again_lease,) = await worker.claim(1)
        assert await worker.complete(again_lease) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
        late = await as_user(server, "alice", "signal", "send", run, "later")
        assert late.code == 2 and late.err.startswith("awp: RUN_FINISHED: "), late.err
