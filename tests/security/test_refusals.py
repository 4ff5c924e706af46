"""What production refuses at start-up, and the audit trail as `awp run get` shows it."""

from __future__ import annotations

import pytest
from rich.console import Console

from awp.v1 import runs_pb2, types_pb2
from awp_cli.render_runs import run_view
from awp_sdk import decode
from awp_server.config import parse

BASE = [
    "--database-url",
    "postgresql://db.example/awp",
    "--worker-token",
    "w",
    "--admin-token",
    "a",
]


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--listen", "0.0.0.0:50051"], "refusing to serve plaintext on 0.0.0.0:50051"),
        (["--listen", "10.1.2.3:50051"], "refusing to serve plaintext"),
        (["--tls-cert-file", "c.pem"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-client-ca-file", "ca.pem"], "needs --tls-cert-file and --tls-key-file"),
    ],
)
def test_the_server_refuses_what_would_expose_it(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse([*BASE, *argv], environ={})
    assert exited.value.code == 2
    assert problem in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tokens", "missing"),
    [
        ([], "--worker-token and --admin-token"),
        (["--worker-token", "w"], "--admin-token"),
        (["--admin-token", "a"], "--worker-token"),
    ],
)
def test_the_server_refuses_to_start_without_a_credential_for_each_role(
    tokens: list[str], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Caught at start (docs/configuration.md), not at the first call of the missing role."""
    with pytest.raises(SystemExit) as exited:
        parse(["--database-url", "postgresql://db.example/awp", *tokens], environ={})
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"refusing to start without {missing}:" in errors[0]


def test_one_token_is_enough_beside_a_credentials_file_or_when_insecure() -> None:
    base = ["--database-url", "postgresql://db.example/awp", "--worker-token", "w"]
    assert parse([*base, "--credentials-file", "c.yaml"], environ={}).credentials_file
    assert parse([*base, "--insecure"], environ={}).insecure
    assert parse(base, environ={"AWP_ADMIN_TOKEN": "a"}).admin_token == "a"


def test_plaintext_beyond_loopback_is_allowed_only_when_told_insecure() -> None:
    assert parse([*BASE, "--listen", "0.0.0.0:50051", "--insecure"], environ={}).insecure
    assert parse([*BASE, "--listen", "127.0.0.1:50051"], environ={}).tls is None
    served = parse(
        [*BASE, "--listen", "0.0.0.0:50051", "--tls-cert-file", "c", "--tls-key-file", "k"],
        environ={},
    )
    assert served.tls is not None and served.tls.client_ca_file is None


def test_run_get_shows_who_started_and_who_canceled() -> None:
    run = runs_pb2.Run(
        id="r",
        workflow_name="w",
        workflow_version=1,
        state=types_pb2.RUN_STATE_RUNNING,
        started_by="ci",
    )
    run.cancel_requested_by = "ops"
    console = Console(width=200, record=True)
    console.print(run_view(decode.run_detail(runs_pb2.GetRunResponse(run=run))))
    text = console.export_text()
    assert "started by ci" in text and "cancel requested by ops" in text
