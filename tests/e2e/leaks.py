"""Every form a password can leak in (plain, Basic auth, URL-encoded, ...) and a search of a text
for them; shared by the secrets and the hostile-server tests."""

from __future__ import annotations

import base64
from urllib.parse import quote

# "bob:" is 4 bytes: base64 of "bob:<pw>" does not contain base64 of the password (as it
# would for "alice:", 6 bytes), so only redacting the Basic credential itself can hide it.
ECHO_USER = "bob"


def forms(secret: str, users: tuple[str, ...] = ("opencode", ECHO_USER)) -> list[str]:
    """A password as it could leak: plain, URL-quoted, base64, inside a Basic credential."""
    basic = [base64.b64encode(f"{user}:{secret}".encode()).decode() for user in users]
    return [
        secret,
        quote(secret, safe=""),
        base64.b64encode(secret.encode()).decode(),
        *basic,
        *(b.rstrip("=") for b in basic),
        *(f"{user}:{secret}" for user in users),
    ]


def leaks(text: str, secrets: list[str]) -> list[str]:
    return [f for s in secrets for f in forms(s) if f in text]
