"""What the console's forms do: sign in and out, cancel a run, retry a run, decide an
approval a task waits for.

Every form is checked by web.check_write (same origin, synchronizer token, role) before
awp-server is called; the server checks the role again and records the credential's
name on the run (Run.started_by, Run.cancel_requested_by) or with the decision.
"""

from __future__ import annotations

import logging
from typing import Final
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from awp_console import api
from awp_console.web import (
    caller,
    check_write,
    console_of,
    page,
    same_origin,
    session_of,
    set_cookie,
)

log = logging.getLogger("awp.console")

# A token longer than this is no token of AWP's (they are 43 characters).
MAX_TOKEN_CHARS: Final = 1024
# The decide form's buttons, and the call each makes.
DECISIONS: Final = {"approve": "Approve", "reject": "Reject"}


def _local(target: str | None) -> str:
    """Where to go after signing in: a path of this console, never another site."""
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return "/"


async def login_form(request: Request) -> Response:
    target = _local(request.query_params.get("next"))
    return page(request, None, "login.html", next=target, problem="")


async def login(request: Request) -> Response:
    form = await request.form()
    target = _local(str(form.get("next", "")))
    session = session_of(request)
    given = form.get("csrf")
    if (
        not same_origin(request)
        or session is None
        or not isinstance(given, str)
        or not session.form_token_ok(given)
    ):
        raise HTTPException(403, "refused: the sign-in form is stale or forged; reload it")
    token = str(form.get("token", "")).strip()
    console = console_of(request)
    problem = ""
    if not token or len(token) > MAX_TOKEN_CHARS:
        problem = "Give a token."
    else:
        try:
            identity = await console.connection.as_caller(token).who_am_i()
        except api.Unauthenticated:
            problem = "awp-server does not know this token."
        else:
            signed_in = console.sessions.sign_in(session, token, identity)
            log.info("signed in", extra={"credential": identity.name})
            redirect = RedirectResponse(target, status_code=303)
            set_cookie(redirect, signed_in, console.secure_cookie)
            return redirect
    refused = page(request, None, "login.html", next=target, problem=problem)
    refused.status_code = 401
    return refused


async def logout(request: Request) -> Response:
    form = await request.form()
    session = session_of(request)
    given = form.get("csrf")
    if (
        same_origin(request)
        and session is not None
        and isinstance(given, str)
        and session.form_token_ok(given)
    ):
        console_of(request).sessions.drop(session.id)
    return RedirectResponse("/login", status_code=303)


async def cancel(request: Request) -> Response:
    who = await caller(request)
    form = await request.form()
    check_write(request, form, who, "CancelRun")
    run_id = request.path_params["run_id"]
    reason = str(form.get("reason", "")).strip()
    await who.api.cancel(run_id, reason or f"canceled from the console by {who.identity.name}")
    log.info("cancel requested", extra={"run_id": run_id, "credential": who.identity.name})
    return RedirectResponse(f"/runs/{quote(run_id)}", status_code=303)


async def retry(request: Request) -> Response:
    who = await caller(request)
    form = await request.form()
    check_write(request, form, who, "RetryRun")
    run_id = request.path_params["run_id"]
    started = await who.api.retry(
        run_id,
        from_task=str(form.get("from_task", "")).strip() or None,
        request_id=str(form.get("request_id", "")).strip() or None,
    )
    log.info(
        "retry started",
        extra={"run_id": started.id, "retried_from": run_id, "credential": who.identity.name},
    )
    return RedirectResponse(f"/runs/{quote(started.id)}", status_code=303)


async def decide(request: Request) -> Response:
    """Approve or Reject (the form's button says which) what a task waits for, with the
    form's comment; back to the run with that task's panel open."""
    who = await caller(request)
    form = await request.form()
    decision = form.get("decision")
    if decision not in DECISIONS:
        raise HTTPException(400, "decision must be approve or reject")
    rpc = DECISIONS[str(decision)]
    check_write(request, form, who, rpc)
    run_id = request.path_params["run_id"]
    task_key = str(form.get("task_key", ""))
    comment = str(form.get("comment", "")).strip()
    call = who.api.approve if rpc == "Approve" else who.api.reject
    decided = await call(run_id, task_key, comment)
    log.info(
        "approval decided",
        extra={
            "run_id": run_id,
            "task_key": task_key,
            "decision": decision,
            "resumed_attempt": decided.resumed_attempt,
            "credential": who.identity.name,
        },
    )
    return RedirectResponse(f"/runs/{quote(run_id)}#task={quote(task_key)}", status_code=303)
