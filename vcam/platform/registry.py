"""The Windows registry, read-only: what DirectShow filters (virtual cameras) are registered. Every
function answers "absent" where there is no registry (POSIX), so callers need no OS test."""

from __future__ import annotations


def classes_root_default(key: str) -> str | None:
    """The default value of ``HKEY_CLASSES_ROOT\\key`` ('' when it has none), None when the key is
    absent or this is not Windows (no ``winreg``)."""
    try:
        import winreg
    except ImportError:
        return None
    try:
        return winreg.QueryValue(winreg.HKEY_CLASSES_ROOT, key)  # type: ignore[attr-defined,unused-ignore]
    except OSError:
        return None
