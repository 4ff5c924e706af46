"""awp: the user and operator CLI of AWP (workflows, runs, workers, stats, `awp dev`)."""

import os

# gRPC's C core logs each failed TLS handshake on stderr at INFO; the CLI says what went
# wrong in its own one line. Set before anything imports grpc; an explicit setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
