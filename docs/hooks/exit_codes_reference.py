"""docs/reference/exit-codes.md, written from `fleetrl/exit_codes.py` at build time: one row per
code the code defines, with its meaning, so the page cannot list a code fleetrl does not return."""

from __future__ import annotations

from fleetrl.exit_codes import MEANINGS

PAGE = "reference/exit-codes.md"


def page() -> str:
    rows = [f"| {code} | {meaning} |" for code, meaning in MEANINGS]
    return "\n".join(
        [
            "# Exit codes",
            "",
            "What `fleetrl` returns (generated from `fleetrl/exit_codes.py` when the site is built). "
            "`fleetrl train` runs under a [supervisor](../concepts/supervisor.md), which returns these codes "
            "for the whole run.",
            "",
            "| code | meaning |",
            "| --- | --- |",
            *rows,
            "",
            "On 130 and 143 the controller wrote a checkpoint of the current state and stopped within",
            "`watchdog.stop_grace_s`, or (frozen, or out of time) was reported as `interrupted` and killed; the",
            "last line names the newest intact checkpoint, or says there is none; a second signal stops at once.",
            "`fleetrl top`, `stack` and `diagnose` exit 2 for a run that is not running or has no report.",
            "",
        ]
    )
