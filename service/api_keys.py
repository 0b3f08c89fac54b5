"""API keys: format, generation and hashing.

A key looks like `fg_<key id>_<secret>`: `fg_` makes it recognisable (secret
scanners, logs), the key id (16 hex characters) is public and indexes the
store, the secret is 32 random bytes (base64url). The store keeps
`hmac-sha256:<hex>` of the whole key, keyed with a server-side pepper
(`FAIRGATE_API_KEY_PEPPER`): 256 random bits need no slow KDF, and a leaked
store dump cannot be used to test guesses without the pepper. Verification
compares digests with `hmac.compare_digest` (constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "fg_"
HASH_SCHEME = "hmac-sha256"
_KEY_RE = re.compile(r"^fg_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    secret: str


def generate_key() -> NewKey:
    key_id = secrets.token_hex(8)
    return NewKey(key_id, f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}")


def key_id_of(secret: str) -> str | None:
    """The key id of a well-formed key, else None."""
    m = _KEY_RE.match(secret)
    return m.group(1) if m else None


def hint(key_id: str) -> str:
    return f"{KEY_PREFIX}{key_id}_…"


class KeyHasher:
    def __init__(self, pepper: bytes) -> None:
        if len(pepper) < 16:
            raise ValueError("the API key pepper must be at least 16 bytes")
        self._pepper = pepper

    @classmethod
    def from_setting(cls, pepper: str) -> KeyHasher:
        """A configured pepper, or a random one (keys then die with the process)."""
        return cls(pepper.encode() if pepper else secrets.token_bytes(32))

    def hash(self, secret: str) -> str:
        digest = hmac.new(self._pepper, secret.encode(), hashlib.sha256).hexdigest()
        return f"{HASH_SCHEME}:{digest}"

    def verify(self, secret: str, stored: str) -> bool:
        return hmac.compare_digest(self.hash(secret).encode(), stored.encode())


def tokens_equal(presented: str, expected: str) -> bool:
    """Constant-time comparison that also hides the expected token's length."""
    a = hashlib.sha256(presented.encode()).digest()
    b = hashlib.sha256(expected.encode()).digest()
    return hmac.compare_digest(a, b)
