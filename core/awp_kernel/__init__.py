"""The workflow kernel: pure rules of AWP (no I/O).

Definition validation, the allowed state transitions and the retry rule. Storage and
transport call into it; it calls nothing outside the standard library.
"""
