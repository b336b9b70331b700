"""User-facing errors. The CLI prints these without a traceback; anything else is a bug."""
from __future__ import annotations


class HpcbenchError(Exception):
    """An error caused by the user's input or environment, with a message that says what to fix."""


class ConfigError(HpcbenchError):
    """A bad configuration key or value. The message names the key and what was expected."""


class DataError(HpcbenchError):
    """A missing, corrupt or malformed data file. The message names the file."""


class DistributedError(HpcbenchError):
    """A problem with the distributed layout (ranks, instances, rendezvous)."""
