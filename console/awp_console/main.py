"""`awp console`: the command (registered by the `awp` CLI) and the HTTP server behind it.

Only the settings are imported when the CLI builds its parser; the web stack is loaded
when the console starts.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from awp_common import extras, flags, logs
from awp_console.settings import Settings

log = logging.getLogger("awp.console")

DESCRIPTION = (
    "Serves the web console: runs (live), workflows, workers and the reliability figures "
    "of an awp-server, through its public API. On loopback by default; with credentials "
    "on the server, each browser signs in with a token."
)
# uvicorn's wait for open connections (a run page's event stream) at shutdown.
SHUTDOWN_GRACE_S = 3


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "console", help="serve the web console", description=DESCRIPTION, epilog=flags.EPILOG
    )
    # Suppressed: --address and the TLS flags are also the `awp` command's own options.
    flags.add_flags(parser, Settings, suppress=True)
    parser.set_defaults(run=lambda args: serve(flags.settings(Settings, parser, args)))


def bind(listen: str) -> socket.socket:
    """The listening socket, bound before uvicorn starts, so that port 0 is resolved and
    printed (what `awp dev` and the tests wait for)."""
    host, port = flags.host_port(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings) -> int:
    problem = extras.CONSOLE.problem("awp console")
    if problem is not None:
        print(f"awp: {problem}", file=sys.stderr)
        return 2
    import uvicorn  # noqa: PLC0415 (the web stack only when serving, and installed)

    from awp_console.app import create_app  # noqa: PLC0415

    logs.setup(settings.log_format, settings.log_level)
    # The console logs what matters itself (the address, sign-ins, writes); these would
    # add a line per metrics scrape and uvicorn's start-up chatter.
    for noisy in ("httpx", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        sock = bind(settings.listen)
    except OSError as exc:
        print(f"awp console: cannot listen on {settings.listen}: {exc.strerror}", file=sys.stderr)
        return 3
    host, port = sock.getsockname()[:2]
    scheme = "https" if settings.https else "http"
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(
        create_app(settings),
        ssl_certfile=settings.https_cert_file,
        ssl_keyfile=settings.https_key_file,
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    log.info("awp console listening", extra={"url": f"{scheme}://{shown}:{port}"})
    print(f"awp console listening on {scheme}://{shown}:{port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
