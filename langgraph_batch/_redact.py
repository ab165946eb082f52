"""URLs fit to show: one rule for reprs, logs and errors (a password in a URL never shows)."""

from __future__ import annotations

__all__ = ("safe_url",)


def safe_url(url: str) -> str:
    """`url` without its password, for logs, reprs and errors.

    Example:
        >>> safe_url("http://user:pw@host:8000/v1")
        'http://user:***@host:8000/v1'
        >>> safe_url("redis://host:6379/0")
        'redis://host:6379/0'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    creds, _, host = authority.rpartition("@")
    user = creds.partition(":")[0]
    return f"{scheme}://{user + ':***@' if user else '***@'}{host}{slash}{path}"
