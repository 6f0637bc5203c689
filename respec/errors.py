"""Exception types of the engine. Every bad input raises a subclass of RespecError with one clear,
human-readable message; the CLI turns any RespecError into that message and exit status 2."""
from __future__ import annotations


class RespecError(Exception):
    """Base class: an error caused by input or environment, reported to the user as its message."""


class ConfigError(RespecError, ValueError):
    """A setting is out of range, of the wrong type, or unknown (method names included)."""


class PromptError(RespecError, ValueError):
    """The prompt is empty, or too long for the model's context window."""


class ModelLoadError(RespecError):
    """A model (or an EAGLE head) could not be found or loaded; the message names what was tried."""


class TraceFormatError(RespecError, ValueError):
    """A trace file is malformed, from an unknown schema version, or internally inconsistent."""
