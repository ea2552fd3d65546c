"""REST auth: `Authorization: Bearer <token>` with an operator API key or a device token.

Operator keys are configured by SHA-256 (compared in constant time); device tokens are
checked by the device registry (`authenticate_token`, issued by `edgefleet fleet enroll`).

Signed bodies (POST /v1/feedback): header `X-EF-Signature: sha256=<hex>` where hex is
HMAC-SHA256 over the exact request body bytes, keyed with
- for a device: its HMAC device key (the same key that signs its MQTT messages);
- for an operator: the UTF-8 bytes of the hex SHA-256 of its API key
  (`hashlib.sha256(api_key.encode()).hexdigest().encode()`), which the server holds.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from edgefleet.cloud.registry import Registry
from edgefleet.cloud.settings import OperatorKey
from edgefleet.shared.errors import AuthError, Forbidden
from edgefleet.shared.hashing import same_hex

SIGNATURE_HEADER = "X-EF-Signature"


@dataclass(frozen=True)
class Principal:
    kind: Literal["operator", "device"]
    id: str

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.id}"


def key_digest(api_key: str) -> str:
    """What goes in `api_keys[].sha256` for an operator key."""
    return hashlib.sha256(api_key.encode()).hexdigest()


class Authenticator:
    def __init__(self, operator_keys: list[OperatorKey], registry: Registry):
        self._operators = [(k.name, k.sha256) for k in operator_keys]
        self._registry = registry

    def authenticate(self, authorization: str | None) -> Principal:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError("missing bearer token")
        digest = key_digest(token)
        for name, known in self._operators:
            if hmac.compare_digest(known, digest):
                return Principal("operator", name)
        device_id = self._registry.authenticate_token(token)
        if device_id is not None:
            return Principal("device", device_id)
        raise AuthError("unknown or revoked token", hint="check the token; devices re-enroll")

    def is_operator(self, token: str) -> bool:
        """Whether `token` is an operator API key."""
        digest = key_digest(token)
        return any(hmac.compare_digest(known, digest) for _, known in self._operators)

    def signing_key(self, principal: Principal) -> bytes | None:
        if principal.kind == "device":
            return self._registry.device_key(principal.id)
        return next(
            (digest.encode() for name, digest in self._operators if name == principal.id), None
        )

    def verify_body(self, principal: Principal, body: bytes, header: str | None) -> str:
        """Check `X-EF-Signature`; returns the hex signature (stored with the record)."""
        if not header:
            raise AuthError(f"missing {SIGNATURE_HEADER} header", code="signature_missing")
        given = header.strip().removeprefix("sha256=")
        key = self.signing_key(principal)
        if key is None:
            raise AuthError("no signing key for this principal", code="signature_invalid")
        expected = hmac.new(key, body, hashlib.sha256).hexdigest()
        if not same_hex(given, expected):
            raise AuthError(
                f"{SIGNATURE_HEADER} does not match the body",
                code="signature_invalid",
                hint="sign the exact body bytes: sha256=<hex HMAC-SHA256(key, body)>",
            )
        return expected


def sign_body(key: bytes, body: bytes) -> str:
    """The header value a client sends (documented scheme, used by tests and tools)."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.services.auth
    return auth


_bearer = HTTPBearer(auto_error=False, description="device token or operator API key")


def require_device_or_operator(
    request: Request, creds: HTTPAuthorizationCredentials | None = Security(_bearer)
) -> Principal:
    """FastAPI dependency: any valid bearer token."""
    header = f"Bearer {creds.credentials}" if creds else request.headers.get("authorization")
    principal = authenticator(request).authenticate(header)
    request.state.principal = principal
    return principal


def require_operator(principal: Principal = Depends(require_device_or_operator)) -> Principal:
    """FastAPI dependency: an operator API key only."""
    if principal.kind != "operator":
        raise Forbidden("this endpoint needs an operator API key")
    return principal


def require_device_scope(principal: Principal, device_id: str) -> None:
    """A device may act only on its own data; operators on any."""
    if principal.kind == "device" and principal.id != device_id:
        raise Forbidden(f"device {principal.id!r} may not act for {device_id!r}")
