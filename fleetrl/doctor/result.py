"""The outcome of one preflight check: a status, what was found, and on failure what to do."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"  # the run would freeze or crash: `fleetrl train` refuses to start
    WARN = "warn"  # the run can start, but something is likely wrong or slow
    SKIP = "skip"  # the check does not apply here; `detail` says why


@dataclass(frozen=True)
class Check:
    name: str  # dotted, e.g. 'disk.ray_temp', 'network.reachability'
    status: Status
    detail: str  # what was found, with the numbers and addresses involved
    remedy: str = ""  # what to do about a FAIL or WARN
    seconds: float = 0.0  # how long the check took

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "status": self.status.value,
            "ok": not self.failed,
            "detail": self.detail,
            "remedy": self.remedy,
            "seconds": round(self.seconds, 3),
        }


def passed(name: str, detail: str) -> Check:
    return Check(name, Status.PASS, detail)


def failed(name: str, detail: str, remedy: str) -> Check:
    return Check(name, Status.FAIL, detail, remedy)


def warned(name: str, detail: str, remedy: str) -> Check:
    return Check(name, Status.WARN, detail, remedy)


def skipped(name: str, reason: str) -> Check:
    return Check(name, Status.SKIP, reason)
