"""The console over HTTP against a real awp-server (in this process) with named
credentials: sign-in, the session cookie, the checks every write passes (same origin,
synchronizer token, role) and the server's own refusal, the pages and the event stream.

The browser tests (test_console_browser) drive the same through Chromium against real
processes; these pin the HTTP contract exactly.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import grpc
import httpx
import pytest
import yaml

from awp.v1 import control_pb2_grpc, runs_pb2
from awp_console.app import create_app
from awp_console.settings import Settings
from awp_db import coordination, runs, workflows
from awp_db.connect import Pool
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.placement import Placement
from awp_protocol.errors import Reason
from awp_protocol.roles import Role, file_entry
from kit import ServerFactory, ServerHandle, expect_error, spec, start_run
from kit.db import register

ORIGIN = "https://127.0.0.1:8080"
TOKENS = {
    "root": "token-of-root",
    "alice": "token-of-alice",
    "victor": "token-of-victor",
    "ada": "token-of-ada",
}
ROLES = {"root": Role.ADMIN, "alice": Role.SUBMITTER, "victor": Role.VIEWER, "ada": Role.APPROVER}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
async def server(start_server: ServerFactory, tmp_path: Path) -> ServerHandle:
    path = tmp_path / "credentials.yaml"
    entries = [file_entry(name, TOKENS[name], [ROLES[name]]) for name in TOKENS]
    path.write_text(yaml.safe_dump({"credentials": entries}))
    return await start_server(worker_token="", admin_token="", credentials_file=str(path))


async def _client(address: str) -> AsyncIterator[httpx.AsyncClient]:
    # https in the URL only: the cookie is Secure, and httpx returns a Secure cookie over
    # https alone (a browser also does on loopback).
    app = create_app(Settings(address=address))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=ORIGIN, follow_redirects=False
        ) as client,
    ):
        yield client


@pytest.fixture
async def browser(server: ServerHandle) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(server.address):
        yield client


async def csrf_of(client: httpx.AsyncClient, path: str) -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found, page.text
    return found[1]


async def sign_in(client: httpx.AsyncClient, name: str) -> None:
    csrf = await csrf_of(client, "/login")
    answer = await client.post(
        "/login",
        data={"csrf": csrf, "token": TOKENS[name], "next": "/runs"},
        headers={"origin": ORIGIN},
    )
    assert (answer.status_code, answer.headers["location"]) == (303, "/runs"), answer.text


async def started_run(server: ServerHandle, pool: Pool, tasks: int = 2) -> str:
    return str(await start_run(pool, spec("console-wf", tasks, chain=True)))


async def get_run(server: ServerHandle, run_id: str) -> runs_pb2.Run:
    async with server.channel() as channel:
        answer = await control_pb2_grpc.ControlServiceStub(channel).GetRun(
            runs_pb2.GetRunRequest(run_id=run_id),
            metadata=(("authorization", f"Bearer {TOKENS['root']}"),),
        )
    return answer.run


async def test_every_page_needs_a_sign_in_and_the_cookie_is_kept_safe(
    browser: httpx.AsyncClient,
) -> None:
    first = await browser.get("/runs?state=running")
    assert first.status_code == 303
    assert first.headers["location"] == "/login?next=/runs%3Fstate%3Drunning"
    assert (await browser.get("/api/runs/x/events")).status_code == 401
    csrf = await csrf_of(browser, "/login")
    wrong = await browser.post(
        "/login", data={"csrf": csrf, "token": "not-a-token"}, headers={"origin": ORIGIN}
    )
    assert wrong.status_code == 401 and "does not know this token" in wrong.text
    before = browser.cookies["awp_console_session"]
    await sign_in(browser, "alice")
    # Signing in replaces the session id: one planted before is worth nothing.
    assert browser.cookies["awp_console_session"] != before
    page = await browser.get("/runs")
    assert page.status_code == 200
    assert 'id="who-name" title="credential name">alice<' in page.text


async def test_the_sign_in_cookie_is_http_only_secure_and_same_site_strict(
    browser: httpx.AsyncClient,
) -> None:
    csrf = await csrf_of(browser, "/login")
    answer = await browser.post(
        "/login", data={"csrf": csrf, "token": TOKENS["victor"]}, headers={"origin": ORIGIN}
    )
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "secure" in cookie and "samesite=strict" in cookie
    assert TOKENS["victor"] not in answer.headers["set-cookie"]


async def test_a_sign_in_from_another_site_is_refused(browser: httpx.AsyncClient) -> None:
    csrf = await csrf_of(browser, "/login")
    answer = await browser.post(
        "/login",
        data={"csrf": csrf, "token": TOKENS["alice"]},
        headers={"origin": "https://evil.example"},
    )
    assert answer.status_code == 403
    assert "awp_console_session" not in answer.headers.get("set-cookie", "")


async def test_pages_carry_the_security_headers(browser: httpx.AsyncClient) -> None:
    await sign_in(browser, "victor")
    for path in ("/", "/runs", "/workflows", "/workers", "/static/console.css"):
        answer = await browser.get(path)
        assert answer.status_code == 200, (path, answer.text)
        assert "script-src 'self'" in answer.headers["content-security-policy"]
        assert answer.headers["x-frame-options"] == "DENY"
    assert (await browser.get("/runs")).headers["cache-control"] == "no-store"


async def test_a_host_name_the_console_does_not_serve_is_refused(
    browser: httpx.AsyncClient,
) -> None:
    answer = await browser.get("/login", headers={"host": "rebound.example"})
    assert answer.status_code == 400


async def test_a_cancel_needs_the_form_token_and_the_same_origin(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    run_id = await started_run(server, pool)
    await sign_in(browser, "alice")
    csrf = await csrf_of(browser, f"/runs/{run_id}")
    cancel = f"/runs/{run_id}/cancel"
    for data, headers in (
        ({}, {"origin": ORIGIN}),
        ({"csrf": "guessed"}, {"origin": ORIGIN}),
        ({"csrf": csrf}, {"origin": "https://evil.example"}),
        ({"csrf": csrf}, {}),  # neither Origin nor Referer
    ):
        refused = await browser.post(cancel, data=data, headers=headers)
        assert refused.status_code == 403, (data, headers)
    assert not (await get_run(server, run_id)).cancel_requested_by
    done = await browser.post(
        cancel, data={"csrf": csrf, "reason": "from a test"}, headers={"referer": f"{ORIGIN}/runs"}
    )
    assert (done.status_code, done.headers["location"]) == (303, f"/runs/{run_id}")
    assert (await get_run(server, run_id)).cancel_requested_by == "alice"
    page = await browser.get(f"/runs/{run_id}")
    assert 'id="canceled-by">alice<' in page.text
    assert 'id="cancel-form"' not in page.text  # already asked


async def test_a_viewer_gets_no_buttons_and_a_forged_cancel_is_refused_twice(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    run_id = await started_run(server, pool)
    await sign_in(browser, "victor")
    page = await browser.get(f"/runs/{run_id}")
    assert page.status_code == 200
    assert 'id="cancel-form"' not in page.text and 'id="retry-form"' not in page.text
    # The viewer's own session token (from the sign-out form) does not make it a submitter.
    csrf = CSRF.search(page.text)
    assert csrf
    forged = await browser.post(
        f"/runs/{run_id}/cancel", data={"csrf": csrf[1]}, headers={"origin": ORIGIN}
    )
    assert forged.status_code == 403
    assert "&#39;victor&#39; (viewer) may not call CancelRun" in forged.text
    # Past the console, awp-server refuses the viewer's credential on its own.
    async with server.channel() as channel:
        refused = await expect_error(
            control_pb2_grpc.ControlServiceStub(channel).CancelRun(
                runs_pb2.CancelRunRequest(run_id=run_id),
                metadata=(("authorization", f"Bearer {TOKENS['victor']}"),),
            )
        )
    assert (refused.code, refused.reason) == (
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.PERMISSION_DENIED,
    )
    assert not (await get_run(server, run_id)).HasField("cancel_requested_at")


async def test_a_decision_needs_the_form_token_the_same_origin_and_a_role_that_decides(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    run_id = await started_run(server, pool)
    decide = f"/runs/{run_id}/decide"
    for user in ("victor", "alice"):  # a viewer, and a submitter: neither decides
        await sign_in(browser, user)
        csrf = await csrf_of(browser, f"/runs/{run_id}")
        form = {"csrf": csrf, "task_key": "t0", "decision": "approve", "comment": "ok"}
        forged = await browser.post(decide, data=form, headers={"origin": ORIGIN})
        assert forged.status_code == 403, user
        assert f"&#39;{user}&#39; ({ROLES[user]}) may not call Approve" in forged.text
    await sign_in(browser, "ada")
    csrf = await csrf_of(browser, f"/runs/{run_id}")
    for data, headers in (
        ({"task_key": "t0", "decision": "reject"}, {"origin": ORIGIN}),
        ({"csrf": "guessed", "task_key": "t0", "decision": "reject"}, {"origin": ORIGIN}),
        (
            {"csrf": csrf, "task_key": "t0", "decision": "reject"},
            {"origin": "https://evil.example"},
        ),
        ({"csrf": csrf, "task_key": "t0", "decision": "reject"}, {}),
    ):
        refused = await browser.post(decide, data=data, headers=headers)
        assert refused.status_code == 403, (data, headers)
    unknown = await browser.post(
        decide,
        data={"csrf": csrf, "task_key": "t0", "decision": "maybe"},
        headers={"origin": ORIGIN},
    )
    assert unknown.status_code == 400
    assert "decision must be approve or reject" in unknown.text


async def test_a_retry_from_the_console_names_the_user(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    run_id = await started_run(server, pool)
    worker = await register(pool)
    (lease,) = await worker.dispatch_and_claim()
    assert await worker.complete(lease, "failed", retryable=False) == "ACCEPTED"
    await sign_in(browser, "alice")
    page = await browser.get(f"/runs/{run_id}")
    assert 'id="retry-form"' in page.text
    task = await browser.get(f"/runs/{run_id}/tasks/t0")
    assert "boom" in task.text and 'id="task-attempts"' in task.text
    assert 'id="retry-from-task"' in task.text
    csrf = CSRF.search(page.text)
    request_id = re.search(r'name="request_id" value="([^"]+)"', page.text)
    assert csrf and request_id
    form = {"csrf": csrf[1], "request_id": request_id[1]}
    retried = await browser.post(f"/runs/{run_id}/retry", data=form, headers={"origin": ORIGIN})
    assert retried.status_code == 303
    new_id = retried.headers["location"].removeprefix("/runs/")
    UUID(new_id)
    new = await get_run(server, new_id)
    assert (new.started_by, new.retried_from_run_id) == ("alice", run_id)
    # The same form sent twice starts one run.
    again = await browser.post(f"/runs/{run_id}/retry", data=form, headers={"origin": ORIGIN})
    assert again.headers["location"] == f"/runs/{new_id}"
    shown = await browser.get(f"/runs/{new_id}")
    assert 'id="retried-from"' in shown.text and 'id="started-by">alice<' in shown.text


async def test_the_event_stream_relays_a_run_and_resumes_after_a_seq(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    run_id = UUID(await started_run(server, pool, tasks=1))
    worker = await register(pool)
    (lease,) = await worker.dispatch_and_claim()
    await worker.complete(lease)
    await sign_in(browser, "victor")
    stream = await browser.get(f"/api/runs/{run_id}/events?after=0")
    assert stream.headers["content-type"].startswith("text/event-stream")
    ids = [int(i) for i in re.findall(r"^id: (\d+)", stream.text, re.MULTILINE)]
    assert ids and ids == sorted(ids)
    assert '["task_state", "t0", 1, "succeeded"]' in stream.text
    assert '["run_state", "", 0, "succeeded"]' in stream.text
    assert stream.text.endswith("event: end\r\ndata: \r\n\r\n")
    resumed = await browser.get(
        f"/api/runs/{run_id}/events", headers={"last-event-id": str(ids[-1])}
    )
    assert "event: events" not in resumed.text and "event: end" in resumed.text
    bad = await browser.get(f"/api/runs/{run_id}/events?after=x")
    assert bad.status_code == 400


async def test_what_does_not_exist_is_a_404_and_bad_input_a_400(
    browser: httpx.AsyncClient,
) -> None:
    await sign_in(browser, "victor")
    missing = await browser.get("/runs/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404 and "RUN_NOT_FOUND" in missing.text
    assert (await browser.get("/runs/not-a-uuid")).status_code == 400
    assert (await browser.get("/runs?state=sleeping")).status_code == 400
    assert (await browser.get("/workflows/nope")).status_code == 404


async def test_without_credentials_on_the_server_no_sign_in_is_asked(
    start_server: ServerFactory, pool: Pool
) -> None:
    server = await start_server(worker_token="", admin_token="", insecure=True)
    run_id = str(await start_run(pool, spec("open-wf", 1)))
    async for client in _client(server.address):
        page = await client.get(f"/runs/{run_id}")
        assert page.status_code == 200 and "no credentials required" in page.text
        csrf = CSRF.search(page.text)
        assert csrf  # the anonymous session's form token
        done = await client.post(
            f"/runs/{run_id}/cancel", data={"csrf": csrf[1]}, headers={"origin": ORIGIN}
        )
        assert done.status_code == 303
    run = await get_run(server, run_id)
    assert run.cancel_requested_by == "anonymous"


async def test_the_graph_is_drawn_again_on_request_with_its_task_to_node_map(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    run_id = await started_run(server, pool, tasks=3)
    await sign_in(browser, "victor")
    answer = await browser.get(f"/runs/{run_id}/graph?expand=t")
    assert answer.status_code == 200
    drawn = answer.json()
    assert drawn["node_of"] == [0, 1, 2] and drawn["nodes"] == ["task"] * 3
    assert drawn["too_large"] == []  # no fan-out of that name: nothing to expand
    assert all(f'data-key="t{i}"' in drawn["svg"] for i in range(3))
    assert 'class="node task s-ready"' in drawn["svg"]


def _row(html: str, run_id: str) -> str:
    start = html.index(f'<tr data-run="{run_id}">')
    return html[start : html.index("</tr>", start)]


async def test_a_task_shows_its_last_attempt_s_error_and_the_runs_list_the_failed_task(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    run_id = str(await start_run(pool, spec("console-retried", 2, max_attempts=2)))
    worker = await register(pool)
    await worker.complete_all(await worker.dispatch_and_claim(), "failed")  # t0, t1: "boom"
    await sign_in(browser, "victor")
    waiting = await browser.get(f"/runs/{run_id}/tasks/t0")
    assert 'data-state="waiting_retry"' in waiting.text
    assert re.search(r'id="task-error">[^<]*boom', waiting.text), waiting.text

    async with pool.acquire() as conn:
        assert await coordination.release_retries(conn) == 2
    second = {lease.task_key: lease for lease in await worker.dispatch_and_claim()}
    assert await worker.complete(second["t0"]) == "ACCEPTED"
    assert await worker.complete(second["t1"], "failed") == "ACCEPTED"

    # t0 succeeded on its second attempt: no error shown, the first one's in its attempts.
    succeeded = (await browser.get(f"/runs/{run_id}/tasks/t0")).text
    assert 'data-state="succeeded"' in succeeded
    assert 'id="task-error"' not in succeeded and "task-traceback" not in succeeded
    assert re.search(r'class="attempt-error">.*?boom', succeeded, re.DOTALL)
    failed = (await browser.get(f"/runs/{run_id}/tasks/t1")).text
    assert re.search(r'id="task-error">[^<]*boom', failed)

    # The runs list says which task the failed run failed on, and why.
    row = _row((await browser.get("/runs")).text, run_id)
    assert re.search(r'class="failure">\s*<code>t1</code>: <span class="error"[^>]*>boom', row)
    assert "more failed" not in row


async def test_workers_and_a_task_show_placement(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    workflow = validate(
        WorkflowSpec(
            "console-placed",
            1,
            (
                TaskSpec(
                    "t0",
                    "mock",
                    "noop",
                    placement=Placement.of(["gpu=h100"], resources={"gpu": 1}),
                ),
            ),
        )
    )
    run_id = str(await start_run(pool, workflow))
    await register(pool, models=["llama3-8b"], resources={"gpu": 2})
    await sign_in(browser, "victor")
    workers = (await browser.get("/workers")).text
    assert '<span class="label">model=llama3-8b</span>' in workers
    assert '<span class="label">gpu 0/2</span>' in workers
    task = (await browser.get(f"/runs/{run_id}/tasks/t0")).text
    assert re.search(r'id="placement">requires gpu=h100; reserves 1 gpu;', task), task
    assert 'id="waiting-for">no active worker with label gpu=h100<' in task


async def test_the_run_page_and_the_runs_list_show_the_run_s_priority(
    browser: httpx.AsyncClient, server: ServerHandle, pool: Pool
) -> None:
    stored, _ = await workflows.create(pool, spec("console-urgent", 1))
    async with pool.acquire() as conn:
        started = await runs.start(conn, stored, {}, None, "test", start=runs.Start(priority=7))
    run_id = str(started.run_id)
    await sign_in(browser, "victor")
    page = (await browser.get(f"/runs/{run_id}")).text
    assert re.search(r'id="run-priority">7 ', page), page
    row = _row((await browser.get("/runs")).text, run_id)
    assert '<td class="num run-priority">7</td>' in row
