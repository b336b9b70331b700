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


#: what h5py raises for an HDF5 file that is truncated or corrupt: OSError (bad signature, truncated, unreadable
#: chunk), RuntimeError (damaged metadata, e.g. "bad heap free list" when a membership test walks a group), and
#: KeyError or ValueError from some damaged object headers. A reader turns these into a DataError naming the file.
HDF5_ERRORS: tuple[type[Exception], ...] = (OSError, RuntimeError, KeyError, ValueError)
