"""`held_stderr`: hold what a native library writes to file descriptor 2 while it starts, and show
it only if the start fails.

libtpu's initialisation on a machine without a TPU writes lines that read like failures
("Failed to find host bounds for accelerator type", "WARNING: Logging before InitGoogle()", an
``E0000 ... INVALID_ARGUMENT: unexpected worker hostname`` with a source-location trace) and then
works: the planner only asks it for a compile-only topology. It writes them from C++ straight to
fd 2, which ``sys.stderr`` redirection does not reach, so the descriptor itself is pointed at a
temporary file for the duration and restored afterwards. When the block raises, what was held is
written to the real stderr before the exception propagates, so a real failure shows libtpu's own
words.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["held_stderr"]


@contextlib.contextmanager
def held_stderr() -> Iterator[None]:
    """Send fd 2 to a temporary file inside the block; replay it to fd 2 if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            except BaseException:
                _restore(saved)
                held.seek(0)
                os.write(2, held.read())
                raise
            finally:
                _restore(saved)
    finally:
        os.close(saved)


def _restore(saved: int) -> None:
    """Point fd 2 back at the real stderr (idempotent)."""
    sys.stderr.flush()
    os.dup2(saved, 2)
