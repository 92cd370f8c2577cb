"""Every exit code fleetrl returns, defined once.

The `fleetrl` command, the supervisor of `fleetrl train` (which returns these codes for the whole
run), the controller process it starts, `fleetrl doctor` and `fleetrl sweep` all exit with these
names; no other module writes an exit code as a number. The reference page
(docs/reference/exit-codes.md) is generated from `MEANINGS` when the site is built
(docs/hooks/exit_codes_reference.py), so it cannot drift from the code.

Imports nothing (the CLI and the supervisor import it at start-up).
"""

from __future__ import annotations

import signal

OK = 0
ERROR = 1  # Python's own for an uncaught exception; also a helper process's (a doctor probe's) failure
USER_ERROR = 2
CHECK_FAILED = 3
INCIDENT = 4
TRIALS_FAILED = 5
SIGNAL_BASE = 128  # a run stopped by a signal exits with 128 + its number, the shells' convention


def stopped_by(signum: int) -> int:
    """The exit code of a run stopped by signal `signum` (SIGINT: 130, SIGTERM: 143)."""
    return SIGNAL_BASE + signum


def stop_signal(code: int) -> signal.Signals:
    """The signal an exit code `stopped_by` stands for."""
    return signal.Signals(code - SIGNAL_BASE)


STOPPED_BY_SIGINT = stopped_by(signal.SIGINT)
STOPPED_BY_SIGTERM = stopped_by(signal.SIGTERM)

# What each code means to someone reading a run's end: the rows of the reference page, in order.
MEANINGS: tuple[tuple[int, str], ...] = (
    (OK, "finished"),
    (ERROR, "an unexpected error in fleetrl itself (traceback shown)"),
    (
        USER_ERROR,
        "a user error: bad config key, value or type, missing file, unknown env id, impossible placement — one "
        "message naming the key, the value and what is valid; nothing was started",
    ),
    (CHECK_FAILED, "a preflight check failed (`fleetrl doctor`; `train --skip-doctor` overrides)"),
    (
        INCIDENT,
        "an incident: a worker or the controller died, froze, raised, hung past its deadline, or the ranks "
        "desynchronised — `hang_report.txt` / `hang_report.json` in the run directory say which, where and why "
        "([causes](incident-causes.md)); every process of the run was killed; the last checkpoint is intact. "
        "With `runner.max_restarts`, only once no restart is left",
    ),
    (
        TRIALS_FAILED,
        "(`fleetrl sweep` only) one or more trials failed; each is listed with its exit code and cause, and every "
        "other trial finished",
    ),
    (STOPPED_BY_SIGINT, "stopped by SIGINT (Ctrl-C)"),
    (STOPPED_BY_SIGTERM, "stopped by SIGTERM"),
)
