"""Token authentication and TLS credentials for the gRPC server.

Callers send `authorization: Bearer <token>` in call metadata. Agent tokens may call AgentService only,
operator tokens OperatorService only; health checking and reflection are open. With no tokens
configured every caller is accepted as "anonymous" (loopback development).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable, Mapping

import grpc

from controlplane.service.config import SecurityConfig

AGENT_PREFIX = "/controlplane.v1.AgentService/"
OPERATOR_PREFIX = "/controlplane.v1.OperatorService/"
ANONYMOUS = "anonymous"


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            if text.startswith("Bearer "):
                return text[len("Bearer "):].strip()
    return ""


def _lookup(tokens: Mapping[str, str], presented: str) -> str | None:
    """Constant-time match of a presented token against the configured ones; returns the identity."""
    found = None
    for secret, identity in tokens.items():
        if hmac.compare_digest(secret.encode(), presented.encode()):
            found = identity
    return found


class Authenticator:
    """Maps call metadata to an identity for a method, or refuses."""

    def __init__(self, security: SecurityConfig) -> None:
        self._agent = dict(security.agent_tokens)
        self._operator = dict(security.operator_tokens)
        self.enabled = security.authenticated

    def check(self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None) -> tuple[grpc.StatusCode | None,
                                                                                           str]:
        """Returns (None, identity) when allowed, else (status code, message)."""
        if not self.enabled or not method.startswith((AGENT_PREFIX, OPERATOR_PREFIX)):
            return None, ANONYMOUS
        presented = _bearer(metadata)
        if not presented:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"
        wanted, other = (self._agent, self._operator) if method.startswith(AGENT_PREFIX) else (
            self._operator, self._agent)
        identity = _lookup(wanted, presented)
        if identity is not None:
            return None, identity
        if _lookup(other, presented) is not None:
            return grpc.StatusCode.PERMISSION_DENIED, "this token may not call this service"
        return grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token"

    def identity(self, context: grpc.aio.ServicerContext, method_prefix: str) -> str:
        """The caller's identity (the interceptor has already refused bad tokens)."""
        _, identity = self.check(method_prefix, context.invocation_metadata())
        return identity


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    async def refuse_unary(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    async def refuse_stream(request: object, context: grpc.aio.ServicerContext):
        await context.abort(code, message)
        yield  # pragma: no cover - abort raises

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse_unary)
    return grpc.unary_unary_rpc_method_handler(refuse_unary)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls whose token is missing, unknown, or meant for the other service."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        code, message = self._auth.check(handler_call_details.method, handler_call_details.invocation_metadata)
        if code is None or handler is None:
            return handler
        return _refusal(handler, code, message)


def server_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """TLS credentials (mutual TLS when a client CA is set), or None for plaintext."""
    if security.tls_cert is None or security.tls_key is None:
        return None
    pair = [(security.tls_key.read_bytes(), security.tls_cert.read_bytes())]
    if security.tls_client_ca is not None:
        return grpc.ssl_server_credentials(pair, root_certificates=security.tls_client_ca.read_bytes(),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials(pair)
