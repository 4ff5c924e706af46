"""The console's ASGI application: its routes, middleware and error pages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from awp_console import actions, api, live, pages, web
from awp_console.sessions import Sessions
from awp_console.settings import Settings


def create_app(settings: Settings) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The channel belongs to the server's event loop: made here, closed here.
        connection = api.connect(settings)
        app.state.console = web.Console(
            settings, connection, Sessions(settings.session_idle_s), web.templates()
        )
        try:
            yield
        finally:
            await connection.close()

    run = "/runs/{run_id}"
    routes = [
        Route("/", pages.overview),
        Route("/runs", pages.runs),
        Route(run, pages.run),
        Route(f"{run}/header", pages.run_header),
        Route(f"{run}/graph", pages.run_graph),
        Route(f"{run}/attempts", pages.attempts),
        Route(f"{run}/tasks/{{task_key:path}}", pages.task),
        Route(f"{run}/cancel", actions.cancel, methods=["POST"]),
        Route(f"{run}/retry", actions.retry, methods=["POST"]),
        Route(f"{run}/decide", actions.decide, methods=["POST"]),
        Route(f"/api{run}/events", live.events),
        Route(f"/api{run}/tasks/{{task_key:path}}/stream", live.task_stream),
        Route("/workflows", pages.workflows),
        Route("/workflows/{name}", pages.workflow),
        Route("/workers", pages.workers),
        Route("/schedules", pages.schedules),
        Route("/limits", pages.limits),
        Route("/login", actions.login_form),
        Route("/login", actions.login, methods=["POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("awp_console", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=settings.hosts()),
            Middleware(web.SecurityHeaders),
        ],
        exception_handlers={
            web.SignInNeeded: web.on_sign_in_needed,
            api.AwpError: web.on_api_error,
            HTTPException: web.on_http_error,
        },
        lifespan=lifespan,
    )
