"""Nothing of a sweep outlives it: two kernel guarantees (Linux prctl) instead of bookkeeping.

- `python -m fleetrl.sweep.lifetime PARENT_PID ARGS...` makes SIGTERM its parent-death signal
  and execs `python ARGS...` (a trial's `fleetrl train`). When the Tune worker that started the
  trial ends — the trial stopped by Tune, the worker killed, Ray shut down — the trial gets
  SIGTERM and stops as on Ctrl-C: checkpoint, its own teardown, exit 143. The signal survives the
  exec; it is set here, in a fresh process, rather than in a `preexec_fn` forked from a
  many-threaded Ray worker. If the parent is already gone when it is set, the trial never starts.
- `become_subreaper()`: the sweep process adopts every orphaned descendant, so once Ray is shut
  down it can still wait for the trials whose Tune worker is gone, and kill what is left.

Elsewhere (not Linux) both are no-ops and a trial can outlive a sweep killed with SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from fleetrl import exit_codes

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def become_subreaper() -> None:
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def main(argv: list[str]) -> None:
    parent, *arguments = argv
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before the signal was set
        sys.exit(exit_codes.stopped_by(signal.SIGTERM))
    os.execv(sys.executable, [sys.executable, *arguments])


if __name__ == "__main__":
    main(sys.argv[1:])
