"""Device secrets: generation, hashing for verification-only secrets, sealing of the HMAC key.

Three secrets per device, each stored the way its use demands:
- the broker password is only *verified* (by Mosquitto), so only its hash is kept, in the
  exact format Mosquitto 2.0 reads from a password file (`$7$`, PBKDF2-SHA512);
- the REST token is only verified (by the cloud), so only its SHA-256 is kept; a 256-bit
  random token needs no salt or stretching (nothing to brute-force), and an unsalted
  digest lets the cloud find the device by one indexed lookup;
- the HMAC device key must be *used* by the cloud to check signatures, so it cannot be
  hashed: it is sealed with Fernet (AES-128-CBC + HMAC) under the operator's master key
  when one is configured, and otherwise stored as plain hex (marked `plain:`), which is
  only acceptable when the database itself is protected like a key file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken

from edgefleet.shared.errors import ConfigError

MOSQUITTO_ITERATIONS = 101  # mosquitto_passwd's default; the secrets are 256-bit random
_SALT_CHARS = 9  # token_urlsafe(9) is 12 printable bytes: valid for Mosquitto and EMQX alike


def new_device_key() -> bytes:
    """32 random bytes: the HMAC-SHA256 key a device signs its messages with."""
    return secrets.token_bytes(32)


def new_password() -> str:
    """A broker password; the `efp_` prefix keeps it from starting with "-", which
    command-line clients (`mosquitto_pub -P ...`) would read as an option."""
    return "efp_" + secrets.token_urlsafe(32)


def new_token() -> str:
    """A REST bearer token; the `eft_` prefix makes leaked tokens easy to grep for."""
    return "eft_" + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mosquitto_hash(
    password: str, *, salt: bytes | None = None, iterations: int = MOSQUITTO_ITERATIONS
) -> str:
    """`$7$<iterations>$<salt b64>$<hash b64>`: what `mosquitto_passwd` writes (2.0, PBKDF2-SHA512).

    The salt is 12 printable bytes so the same hash can be exported to EMQX, whose
    built-in database takes the salt as text.
    """
    salt = salt if salt is not None else secrets.token_urlsafe(_SALT_CHARS).encode()
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    salt_b64 = base64.b64encode(salt).decode()
    return f"$7${iterations}${salt_b64}${base64.b64encode(digest).decode()}"


def parse_mosquitto_hash(encoded: str) -> tuple[int, bytes, bytes]:
    """(iterations, salt, digest) of a `$7$` hash; ValueError if it is not one."""
    parts = encoded.split("$")
    if len(parts) != 5 or parts[0] != "" or parts[1] != "7":
        raise ValueError("not a mosquitto $7$ PBKDF2-SHA512 hash")
    return int(parts[2]), base64.b64decode(parts[3]), base64.b64decode(parts[4])


def verify_mosquitto_hash(password: str, encoded: str) -> bool:
    iterations, salt, digest = parse_mosquitto_hash(encoded)
    candidate = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, len(digest))
    return hmac.compare_digest(candidate, digest)


class KeySealer:
    """Seals device HMAC keys at rest with Fernet, or marks them plain without a master key."""

    def __init__(self, master_key: str | bytes | None = None):
        self._fernet: Fernet | None = None
        if master_key:
            try:
                self._fernet = Fernet(master_key)
            except (ValueError, TypeError) as exc:
                raise ConfigError(
                    f"the fleet master key is not a Fernet key: {exc}",
                    hint="make one with `python -c 'from cryptography.fernet import Fernet; "
                    "print(Fernet.generate_key().decode())'`",
                ) from None

    @staticmethod
    def generate_master_key() -> str:
        return Fernet.generate_key().decode()

    def seal(self, key: bytes) -> str:
        if self._fernet is None:
            return "plain:" + key.hex()
        return "fernet:" + self._fernet.encrypt(key).decode()

    def unseal(self, sealed: str) -> bytes:
        kind, _, body = sealed.partition(":")
        if kind == "plain":
            return bytes.fromhex(body)
        if kind == "fernet":
            if self._fernet is None:
                raise ConfigError(
                    "device keys are sealed but no fleet master key is configured",
                    hint="set the same master key the keys were enrolled with",
                )
            try:
                return self._fernet.decrypt(body.encode())
            except InvalidToken:
                raise ConfigError(
                    "a device key does not open with the configured fleet master key",
                    hint="the master key changed since enrollment; restore it or re-enroll",
                ) from None
        raise ConfigError(f"unknown sealed key format {kind!r}")
