"""`awp credentials mint`: a new token and the entry that grants it, for the server's
--credentials-file. The token is printed once and stored nowhere; the entry holds only
its SHA-256, so the file itself is not a secret."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from awp_cli.errors import Exit, usage
from awp_protocol.roles import Role, file_entry, mint_token


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = commands.add_parser("credentials", help="named credentials for awp-server")
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    mint = actions.add_parser(
        "mint",
        help="print a new token and its credentials-file entry",
        description=(
            "Prints a new random token (give it to the client: AWP_TOKEN or "
            "AWP_WORKER_TOKEN) and the entry to append under `credentials:` in the "
            "server's --credentials-file. Several entries may share a role: rotate a key "
            "by adding the new one, moving clients over, then removing the old one."
        ),
    )
    mint.add_argument("--name", required=True, help="who holds it; recorded on what they do")
    mint.add_argument(
        "--role",
        dest="roles",
        action="append",
        required=True,
        choices=[str(role) for role in Role],
        help="a role it grants (repeat for several)",
    )
    mint.add_argument("--json", action="store_true", help="print one JSON object instead")
    mint.add_argument(
        "--file",
        type=Path,
        help="append the entry to this credentials file (created if missing) and print "
        "only the token",
    )
    mint.set_defaults(run=run_mint)


def run_mint(args: argparse.Namespace) -> Exit:
    token = mint_token()
    entry = file_entry(args.name, token, [Role(role) for role in args.roles])
    if args.file is not None:
        _append(args.file, entry)
        print(token)
    elif args.json:
        print(json.dumps({"token": token, "entry": entry}))
    else:
        print(f"token: {token}")
        print("# append under `credentials:` in the server's --credentials-file:")
        print(yaml.safe_dump([entry], sort_keys=False).rstrip())
    return Exit.OK


def _append(path: Path, entry: dict[str, Any]) -> None:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise usage(f"cannot read credentials file {path}: {exc}") from None
    data = data or {"credentials": []}
    entries = data.get("credentials") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise usage(f"{path}: expected a top-level 'credentials:' list")
    entries.append(entry)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
