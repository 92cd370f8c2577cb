"""How results are shown: one line per check for people, one JSON object for machines."""

from __future__ import annotations

import json
from collections import Counter
from typing import TextIO

from fleetrl.doctor.result import Check, Status

NAME_WIDTH = 28


def check_line(check: Check) -> str:
    line = f"{check.status.value.upper():<5} {check.name:<{NAME_WIDTH}} {check.detail}"
    if check.remedy and check.status in (Status.FAIL, Status.WARN):
        line += f"\n      fix: {check.remedy}"
    return line


def summary_line(checks: list[Check], fast: bool, seconds: float) -> str:
    counts = Counter(check.status for check in checks)
    parts = [
        f"{counts[Status.FAIL]} failed",
        f"{counts[Status.WARN]} warning(s)",
        f"{counts[Status.PASS]} passed",
        f"{counts[Status.SKIP]} skipped",
    ]
    subset = " (fast subset)" if fast else ""
    verdict = "NOT READY" if counts[Status.FAIL] else "ready"
    return f"fleetrl doctor{subset}: {verdict}: {', '.join(parts)} in {seconds:.1f} s"


def as_json(checks: list[Check], fast: bool, seconds: float, exit_code: int) -> dict:
    counts = Counter(check.status.value for check in checks)
    return {
        "ok": not any(check.failed for check in checks),
        "exit_code": exit_code,
        "fast": fast,
        "seconds": round(seconds, 3),
        "counts": {status.value: counts.get(status.value, 0) for status in Status},
        "checks": [check.to_json() for check in checks],
    }


def write_json(stream: TextIO, document: dict) -> None:
    stream.write(json.dumps(document, indent=2) + "\n")
    stream.flush()
