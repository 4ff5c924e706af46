"""The console's plumbing: who is calling (session and credential), how pages are
rendered, what every response carries (security headers), and how the API's errors
become pages.

Every page and every browser call goes through `caller()`: a signed-in session's
credential, or, when awp-server runs without credentials, anyone (the server says so
through WhoAmI). Without either, pages redirect to the sign-in form and data calls
answer 401. Writes are checked by `check_write()`: same-origin (Origin, else Referer)
and the session's synchronizer token, then the role; the server checks the role again.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import quote, urlsplit

import jinja2
from markupsafe import Markup
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from awp_common import tracing
from awp_common.durations import format_duration
from awp_console import api, graph
from awp_console.sessions import COOKIE, Session, Sessions
from awp_console.settings import Settings
from awp_sdk.client import AsyncClient
from awp_sdk.enums import TaskState
from awp_sdk.records import Attempt, Identity

log = logging.getLogger("awp.console")

# Task states as the SDK knows them, in the API's order: what bars, counts and filters
# list (a state the SDK adds shows here with no change).
TASK_STATES: Final = tuple(state.value for state in TaskState)

# Scripts, styles and data only from the console itself; no framing, no foreign forms.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


@dataclass
class Console:
    """What every handler shares (app.state.console)."""

    settings: Settings
    # The SDK's client without a credential; each caller's shares its channel.
    connection: AsyncClient
    sessions: Sessions
    templates: Jinja2Templates

    @property
    def secure_cookie(self) -> bool:
        # Browsers keep a Secure cookie over HTTPS and on loopback (a secure context even
        # over HTTP); only plain HTTP to the network (--insecure) must do without.
        return self.settings.https or not self.settings.insecure


@dataclass
class Caller:
    session: Session | None
    api: AsyncClient
    identity: Identity


class SignInNeeded(Exception):
    """The server wants a credential this browser has not given (or no longer has)."""


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def session_of(request: Request) -> Session | None:
    return console_of(request).sessions.get(request.cookies.get(COOKIE))


async def caller(request: Request) -> Caller:
    console = console_of(request)
    session = session_of(request)
    if session is not None and session.identity is not None:
        return Caller(session, console.connection.as_caller(session.token), session.identity)
    anonymous = console.connection.as_caller("")
    try:
        identity = await anonymous.who_am_i()
    except api.Unauthenticated:
        raise SignInNeeded from None
    return Caller(session, anonymous, identity)


def check_write(request: Request, form: FormData, who: Caller, rpc: str) -> Session:
    """The session of a write the caller may make, or a 403 saying why not."""
    if not same_origin(request):
        raise HTTPException(403, "refused: the request did not come from the console's own pages")
    session = who.session
    given = form.get("csrf")
    if session is None or not isinstance(given, str) or not session.form_token_ok(given):
        raise HTTPException(403, "refused: the form is stale or forged; reload the page")
    if not who.identity.may(rpc):
        raise HTTPException(
            403,
            f"refused: credential {who.identity.name!r} ({roles_text(who.identity)}) may not "
            f"call {rpc}",
        )
    return session


def same_origin(request: Request) -> bool:
    """Whether the browser says the request comes from this console's pages."""
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        if referer is None:
            return False
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    return origin == f"{request.url.scheme}://{request.url.netloc}"


def ensure_session(request: Request) -> Session:
    """This browser's session, begun now if it has none (sign-in and open-server forms
    need a synchronizer token before anyone has signed in)."""
    session = getattr(request.state, "new_session", None) or session_of(request)
    if session is None:
        session = console_of(request).sessions.new()
        request.state.new_session = session
    return session


def set_cookie(response: Response, session: Session, secure: bool) -> None:
    response.set_cookie(
        COOKIE, session.id, httponly=True, secure=secure, samesite="strict", path="/"
    )


def page(request: Request, who: Caller | None, template: str, **context: Any) -> HTMLResponse:
    session = (who.session if who is not None else None) or ensure_session(request)
    response = console_of(request).templates.TemplateResponse(
        request,
        template,
        {
            "who": who,
            "csrf": session.csrf,
            "now": datetime.now(UTC),
            "trace_url": console_of(request).settings.trace_url,
            **context,
        },
    )
    fresh: Session | None = getattr(request.state, "new_session", None)
    if fresh is not None:
        set_cookie(response, fresh, console_of(request).secure_cookie)
    return response


def roles_text(identity: Identity) -> str:
    return ", ".join(sorted(identity.roles)) or "no roles"


# ---------------------------------------------------------------- errors as pages


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


async def on_sign_in_needed(request: Request, exc: Exception) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": "sign in first"}, status_code=401)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target)}", status_code=303)


def told(error: api.AwpError) -> str:
    """A failed call in one line: the server's reason (else the gRPC code) and message."""
    return f"{error.reason or _code(error)}: {error.message}"


def _code(error: api.AwpError) -> str:
    return error.code.name if error.code is not None else ""


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, api.AwpError)
    if isinstance(exc, api.Unauthenticated):
        # The server no longer takes the session's credential (rotated out, or the server
        # now requires one): the session is over.
        session = session_of(request)
        if session is not None:
            console_of(request).sessions.drop(session.id)
        return await on_sign_in_needed(request, exc)
    status = 502
    if isinstance(exc, api.PermissionDenied):
        status = 403
    elif isinstance(exc, api.NotFound):
        status = 404
    elif isinstance(exc, api.UNREACHABLE):
        status = 503
    elif _code(exc) in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "ALREADY_EXISTS"):
        status = 400
    if status >= 500:
        log.warning("awp-server call failed: %s", told(exc))
    if _wants_json(request):
        return JSONResponse({"error": told(exc), "reason": exc.reason}, status_code=status)
    return _error_page(request, status, exc.message, exc.reason or _code(exc))


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if _wants_json(request):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
    return _error_page(request, exc.status_code, exc.detail, "")


def _error_page(request: Request, status: int, message: str, reason: str) -> HTMLResponse:
    template = console_of(request).templates.get_template("error.html")
    html = template.render(request=request, status=status, message=message, reason=reason, who=None)
    return HTMLResponse(html, status_code=status)


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response, and no-store to all but static files."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(SECURITY_HEADERS)
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


# ---------------------------------------------------------------- template helpers


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return ""
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if seconds < 1:
        return "just now"
    return f"{format_duration(_round(seconds))} ago"


def _round(seconds: float) -> float:
    """Two significant figures' worth: 12.3 s, 4 min 10 s reads better than 250.4173."""
    if seconds < 10:
        return round(seconds, 1)
    if seconds < 600:
        return float(round(seconds))
    return float(round(seconds / 60) * 60)


def _seconds(value: float | timedelta | None) -> str:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return "" if value is None else format_duration(_round(value))


def outcome(attempt: Attempt) -> str:
    """How an attempt ended, for people: its state, except that a hand-back by a
    draining worker is told from a lost lease (both end `interrupted`)."""
    if attempt.handed_back:
        return "handed back"
    return attempt.state.replace("_", " ")


def _span(start: datetime | None, end: datetime | None, now: datetime | None = None) -> str:
    if start is None:
        return ""
    return _seconds(((end or now or datetime.now(UTC)) - start).total_seconds())


def _ticking(start: datetime | None, now: datetime) -> Markup:
    """The attribute that makes static/clock.js count an element's time on, from the
    seconds it had when the page was made (the browser's clock may not be the server's)."""
    if start is None:
        return Markup("")
    return Markup(' data-elapsed="{:.3f}"').format((now - start).total_seconds())


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _bar(counts: Mapping[str, int], width: float = 160.0) -> list[tuple[str, float, float, int]]:
    """(state, x, width, count) of each state's stretch of a progress bar, in lifecycle
    order."""
    total = sum(counts.values())
    if not total:
        return []
    parts: list[tuple[str, float, float, int]] = []
    x = 0.0
    for state in TASK_STATES:
        count = counts.get(state, 0)
        if count:
            stretch = max(width * count / total, 1.0)
            parts.append((state, round(x, 2), round(stretch, 2), count))
            x += stretch
    return parts


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{int(value):,}" if math.isfinite(value) and value == int(value) else f"{value:,.2f}"


def templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("awp_console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        trace_link=lambda trace_id, template: tracing.trace_link(template, trace_id),
        ago=_ago,
        seconds=_seconds,
        when=_when,
        pretty=_pretty,
        number=_number,
        bar=_bar,
        map_progress=graph.map_progress,
        outcome=outcome,
    )
    env.globals.update(span=_span, ticking=_ticking, task_states=TASK_STATES)
    return Jinja2Templates(env=env)
