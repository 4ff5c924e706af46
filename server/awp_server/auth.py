"""Who may call what: every RPC's roles in one table, checked before the handler runs.

A caller proves a credential with `authorization: Bearer <token>` (the scheme matched
without regard to case, RFC 7235) or, under mutual TLS, with a client certificate whose
common name a credential names. Unknown or missing → UNAUTHENTICATED; known but without
a role the call needs → PERMISSION_DENIED naming the roles that would do. WorkerService
calls after Register are authenticated by their session token instead; health and
reflection are open so that probes and grpcurl work. The caller's credential name is
available to the handler (`caller()`) for the audit trail.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc

from awp_kernel.errors import AwpError, ErrorKind
from awp_protocol.errors import Reason
from awp_protocol.roles import ROLES_OF, token_digest
from awp_server.credentials import Credential, CredentialStore
from awp_server.errors import to_status

# Who made the call being served (None: a server without credentials, i.e. --insecure).
_CALLER: contextvars.ContextVar[Credential | None] = contextvars.ContextVar(
    "awp_caller", default=None
)
ANONYMOUS: Final = "anonymous"


def caller() -> str:
    """The credential name of the call being served, for the audit trail."""
    credential = _CALLER.get()
    return credential.name if credential is not None else ANONYMOUS


def caller_credential() -> Credential | None:
    """The credential of the call being served; None on a server without credentials."""
    return _CALLER.get()


def _bearer(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _certificate_name(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    for name in context.auth_context().get("x509_common_name") or ():
        return name.decode()
    return None


class RoleInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, store: CredentialStore) -> None:
        self._store = store

    def _identify(self, context: grpc.aio.ServicerContext[Any, Any]) -> Credential:
        known = self._store.current()
        token = _bearer(context.invocation_metadata())
        if token is not None:
            credential = known.by_digest.get(token_digest(token))
        else:
            name = _certificate_name(context)
            credential = known.by_common_name.get(name) if name else None
        if credential is None:
            raise AwpError(
                ErrorKind.UNAUTHENTICATED,
                Reason.TOKEN_INVALID,
                "missing or unknown credential (authorization: Bearer <token>, or a client "
                "certificate a credential names)",
            )
        return credential

    def _admit(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Credential:
        credential = self._identify(context)
        needed = ROLES_OF[method]
        if not credential.roles & needed:
            raise AwpError(
                ErrorKind.PERMISSION_DENIED,
                Reason.PERMISSION_DENIED,
                f"credential {credential.name!r} may not call {method.rsplit('/', 1)[-1]}: "
                f"it needs one of the roles {', '.join(sorted(needed))}",
            )
        return credential

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method not in ROLES_OF:
            return handler
        return _guarded(handler, lambda context: self._admit(method, context))


Admit = Callable[[grpc.aio.ServicerContext[Any, Any]], Credential]


def _guarded(
    handler: grpc.RpcMethodHandler[Any, Any], admit: Admit
) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler, run only once `admit` names the caller (else the call aborts).

    The check needs the call's context (for the peer's certificate), which only the
    handler gets; so it wraps the handler rather than deciding in the interceptor."""

    async def enter(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            _CALLER.set(admit(context))
        except AwpError as error:
            await context.abort_with_status(to_status(error))

    def unary(behavior: Any) -> Any:
        async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await enter(context)
            return await behavior(request, context)

        return run

    def streaming(behavior: Any) -> Any:
        async def run(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            await enter(context)
            async for response in behavior(request, context):
                yield response

        return run

    decode, encode = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), decode, encode)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), decode, encode)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), decode, encode)
    return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), decode, encode)
