"""Pure checks for `serve`: where it may listen, the viewer's login, log-safe text.

No I/O and no state: `commands/serve.py` calls these on each start and each request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress

from xaf_hub.errors import UsageError

VIEWER_PASSWORD_ENV = "XAF_HUB_VIEWER_PASSWORD"
MIN_PASSWORD_LENGTH = 12


def is_loopback(host: str) -> bool:
    """Return whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # any other host name could resolve anywhere


def host_header_name(header: str) -> str:
    """Return the host part of an HTTP Host header ("[::1]:80" -> "::1", "a:80" -> "a")."""
    value = header.strip()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def check_exposure(host: str, public: bool, password: str | None) -> None:
    """Refuse a listening address the options do not allow (UsageError)."""
    if public:
        if not password:
            raise UsageError(
                f"--public needs a viewer password: set {VIEWER_PASSWORD_ENV} (colleagues "
                "log in with any user name and that password)"
            )
        if len(password) < MIN_PASSWORD_LENGTH:
            raise UsageError(
                f"{VIEWER_PASSWORD_ENV} is too short: use at least {MIN_PASSWORD_LENGTH} characters"
            )
    elif not is_loopback(host):
        raise UsageError(
            f"refusing to listen on {host}: without --public only a loopback address "
            f"(127.0.0.1, ::1, localhost) is allowed; to let colleagues in, set "
            f"{VIEWER_PASSWORD_ENV} and add --public"
        )


def basic_auth_ok(header: str | None, password: str) -> bool:
    """Return whether an Authorization header carries ``password`` (any user name)."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return False
    _, sep, given = decoded.partition(":")
    if not sep:
        return False
    # Digests first so the comparison takes the same time whatever the lengths.
    return hmac.compare_digest(
        hashlib.sha256(given.encode("utf-8")).digest(),
        hashlib.sha256(password.encode("utf-8")).digest(),
    )


def printable(text: str, limit: int = 200) -> str:
    """Return ``text`` safe for one log line: control characters as "?", at most ``limit``."""
    clean = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")
