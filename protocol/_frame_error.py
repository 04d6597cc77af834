"""The single error type of the batch frame codec (public as `protocol.frame.FrameError`).

Kept in its own module so the private payload helpers can raise it without importing
`protocol.frame` (which imports them).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

import pyarrow as pa
import zstandard


class FrameError(ValueError):
    """A frame, or the input given to build one, breaks PROTOCOL §1.

    ``str(err)`` names the field and the problem and is safe to return to the sender
    (the collector's ``400 invalid_frame`` detail). The frame will never become valid
    by retrying: an agent parks it as poison.
    """


# What third-party decoders raise on malformed input. Deliberately not `Exception`:
# AttributeError/NameError/RuntimeError from our own code are bugs and must surface as
# such, not as a 400 blamed on the sender.
_DECODER_ERRORS: tuple[type[BaseException], ...] = (
    pa.ArrowException,
    zstandard.ZstdError,
    ValueError,
    TypeError,
    LookupError,
    OverflowError,
    NotImplementedError,
    OSError,
    struct.error,
)


@contextlib.contextmanager
def decoder_errors_as_frame_errors(what: str) -> Iterator[None]:
    """Turn anything zstd/pyarrow raise inside the block into ``FrameError("<what>: ...")``.

    A `FrameError` raised inside passes through unchanged.
    """
    try:
        yield
    except FrameError:
        raise
    except _DECODER_ERRORS as exc:
        raise FrameError(f"{what}: {type(exc).__name__}: {exc}") from exc
