"""One error hierarchy for the library.

Library code raises these; only the CLI prints them and picks exit codes. Every error carries a
``hint`` that names the fix, so the CLI can print one line the user can act on; ``page_hint``, where
the hint names a command or flag, says the fix in the panel's words (the page cannot run a command).
"""

from __future__ import annotations


class VcamError(Exception):
    """Base class. ``str(err)`` is the one-line message including the hint."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, page_hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        self.page_hint = page_hint
        super().__init__(message if not hint else f"{message} ({hint})")


class ConfigError(VcamError):
    """A config file, table, key or value is wrong."""

    exit_code = 2


class InputError(VcamError):
    """A frame source (camera, video file, image) cannot be opened or read."""

    exit_code = 3


class OutputError(VcamError):
    """An output (virtual camera, file, window) cannot be opened or written."""

    exit_code = 4


class DeviceError(VcamError):
    """The requested compute device (CUDA, CuPy) is not usable."""

    exit_code = 5


class ModelError(VcamError):
    """A model file is missing, corrupt, fails verification or has unexpected tensors."""

    exit_code = 6


class EngineUnavailable(VcamError):
    """An inference backend cannot run here (not installed or broken)."""

    exit_code = 6


class FaceError(VcamError):
    """A source photo has no face, several faces, or a face name is unknown. ``found``: a photo of
    several faces, theirs left to right (``{"box": [x1, y1, x2, y2], "score"}``), for a picker."""

    exit_code = 7

    def __init__(
        self, message: str, *, hint: str | None = None, page_hint: str | None = None, found: list[dict] | None = None
    ) -> None:
        super().__init__(message, hint=hint, page_hint=page_hint)
        self.found = list(found or [])


class ControlError(VcamError):
    """The control channel (OBS websocket, local socket) failed."""

    exit_code = 8
