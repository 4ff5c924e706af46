"""The protocol's vocabulary, shared by server, worker, CLI and tests. Pure: no I/O.

- limits: every size and count the server refuses beyond, and the protocol version;
- names: the name patterns, and the checks of a worker's Register;
- states: the lifecycle states as storage names them, and which are final;
- jsonvalue: canonical JSON and its size, google.protobuf.Struct <-> dict;
- results: the check of one Complete result (what the server refuses in a TaskResult);
- errors: the error reasons (awp.v1.ErrorReason), the rich google.rpc.Status that carries
  them, which reasons end a worker's session and which status codes are transient.
"""
