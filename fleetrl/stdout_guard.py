"""Keep a command's standard output for what it promises there (`fleetrl eval --json`: one JSON
object), whatever the code it runs prints.

Simulators print from C as well as from Python: PyBullet's client printf's the options panda-gym
connects with (`argv[0]=--background_color_red=...`), and MuJoCo, Isaac or a user's env print
banners and warnings. Redirecting `sys.stdout` would miss C's printf and the processes a vector
env starts, so file descriptor 1 itself points at descriptor 2 for the duration.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Everything written to file descriptor 1 — by Python, by C, by child processes started
    inside — goes to descriptor 2 until the block ends; then 1 is what it was."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()  # what Python and C buffered inside the block leaves for 2, not for 1
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
