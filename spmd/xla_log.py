"""Keep XLA's once-per-compile notices to once per process, without hiding anything else.

XLA's C++ logging prints "GSPMD sharding propagation is going to be deprecated ..." to the
process's stderr each time it partitions a graph: 7 to 9 times in each of our examples. It
cannot be turned off by message (``TF_CPP_MIN_LOG_LEVEL`` would hide every warning), so
`show_repeated_notices_once` puts a filter on file descriptor 2 itself: a pipe whose reader
thread forwards every line to the real stderr, except the second and later copies of the
notices below. Our entry points (examples, benchmarks, the inspector CLI) call it; a library
import never does, since it changes the process's stderr.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

__all__ = ["REPEATED_NOTICES", "show_repeated_notices_once"]

REPEATED_NOTICES = ("GSPMD sharding propagation is going to be deprecated",)

_installed = False  # one filter per process: a second would filter the first's output again


def show_repeated_notices_once(notices: tuple[str, ...] = REPEATED_NOTICES) -> None:
    """Pass stderr (fd 2) through a filter that prints each line containing one of
    ``notices`` once, and every other line unchanged, until the process exits."""
    global _installed
    if _installed:
        return
    _installed = True
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    seen: set[str] = set()

    def forward() -> None:
        pending = b""
        while chunk := os.read(read_end, 65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = []
            for line in lines:
                notice = next((n for n in notices if n.encode() in line), None)
                if notice is not None:
                    if notice in seen:
                        continue
                    seen.add(notice)
                out.append(line + b"\n")
            if out:
                os.write(real, b"".join(out))
        if pending:
            os.write(real, pending)

    reader = threading.Thread(target=forward, name="stderr-filter", daemon=True)
    reader.start()

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(real, 2)  # the pipe loses its last writer: the reader drains it and stops
        reader.join(timeout=5)

    atexit.register(restore)
