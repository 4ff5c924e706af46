"""The workflow kernel: pure rules of AWP (no I/O).

Definition validation, the run outcome, the lease and retry rules. Storage and transport
call into it; it calls nothing but the standard library and the protocol vocabulary
(awp_protocol).
"""
