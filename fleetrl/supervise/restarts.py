"""When the supervisor restarts the controller after an incident (`runner.max_restarts`,
`runner.restart_on`, `runner.restart_window_s`), and the record of each restart.

A restart continues the same run directory from its newest intact checkpoint. Causes a restart
cannot help with never restart (`watch.incident.NEVER_RESTART`, checked in plan/rules.py); user
and config errors are not incidents at all (exit 2). At most `max_restarts` restarts fall within any `restart_window_s`: a
fault that comes back at once ends the run instead of looping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetrl.config.schema import RunnerConfig


@dataclass
class Restart:
    """One restart: the incident that caused it, when the incident began, and its kept report."""

    number: int
    cause: str
    incident_at: float
    report: str


@dataclass
class RestartPolicy:
    max_restarts: int
    restart_on: tuple[str, ...]
    window_s: float
    done: list[Restart] = field(default_factory=list)

    @classmethod
    def of(cls, runner: RunnerConfig) -> RestartPolicy:
        return cls(runner.max_restarts, tuple(runner.restart_on), runner.restart_window_s)

    def refusal(self, cause: str, now: float) -> str | None:
        """Why an incident of `cause` at `now` does not restart (None: it does)."""
        if self.max_restarts == 0:
            return "runner.max_restarts is 0"
        if cause not in self.restart_on:
            return f"{cause} is not in runner.restart_on"
        recent = [r for r in self.done if now - r.incident_at < self.window_s]
        if len(recent) >= self.max_restarts:
            return f"{len(recent)} restart(s) within runner.restart_window_s={self.window_s:g} already (runner.max_restarts)"
        return None
