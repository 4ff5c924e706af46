"""`awp dev` and `awp demo`: the embedded all-in-one stack.

The only part of the CLI that touches storage (it starts a private PostgreSQL and
migrates it); everything else in `awp_cli` is a plain gRPC client.
"""
