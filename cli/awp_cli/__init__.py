"""awp: the user and operator CLI of AWP (workflows, runs, workers, stats, `awp dev`)."""

import os

# Both read when grpc is imported, so set here, before anything imports it; an explicit
# setting wins.
# gRPC's C core logs each failed TLS handshake on stderr at INFO; the CLI says what went
# wrong in its own one line.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# `awp dev` talks gRPC to its server and starts every child with a preexec_fn (the
# parent-death signal, dev/lifetime.py), so subprocess really forks (no vfork) and gRPC's
# fork handlers run, on by default in the C core. In the child they restart gRPC's
# poller on a new epoll fd that subprocess then closes before exec: now and then the
# child aborts before it becomes the coordinator or a worker (ev_epoll1_linux.cc, bad
# file descriptor: grpc/grpc issue number 43055, open since grpcio 1.80); in this process
# the fork's prepare handler can deadlock with a closing channel (grpc/grpc issue number
# 37259). Every child execs at once, so nothing here needs gRPC's fork support.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
