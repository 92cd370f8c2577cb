"""The planted regressions, one source of truth for benchmarks/diagnosis/planted_regressions.py (which
runs each plant's CI tests in a scratch copy of the tree, the plant applied, and needs them red)
and tests/test_planted.py (which checks in CI that each plant still applies to the tree, so that
the script keeps up with the code between its runs).

A plant breaks one headline promise (docs/reference/promises.md) by one exact text substitution in
one file of fleetrl's own code, never in a test, as a regression would; `tests` are the CI tests
of the promise's row that must fail on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STOP_TEST = (
    "tests/test_stops_save.py::test_a_stop_mid_update_saves_the_iteration_and_the_resume_is_the_uninterrupted_run"
)
RESTART_TEST = "tests/test_restarts.py::test_a_crash_costs_one_restart_and_the_run_continues_from_its_checkpoint_to_a_learned_return"


class PlantMoved(Exception):
    """The plant's text is not in its file exactly once: the code has moved on."""


@dataclass(frozen=True)
class Plant:
    name: str
    promise: str
    file: str  # relative to the repository root
    old: str  # found exactly once in `file`
    new: str
    tests: tuple[str, ...]  # CI test ids

    def apply(self, tree: Path) -> None:
        """Plant it in the copy of the repository at `tree`."""
        path = tree / self.file
        text = path.read_text()
        found = text.count(self.old)
        if found != 1:
            raise PlantMoved(
                f"plant {self.name}: {self.file} holds its text {found} times, not once; the code has moved on: "
                f"update the plant in tests/planted.py. The text:\n{self.old}"
            )
        path.write_text(text.replace(self.old, self.new))


PLANTS = (
    Plant(
        "stop_does_not_save",
        "Ctrl-C or SIGTERM in the middle of an update writes a checkpoint of the iteration under way",
        "fleetrl/controller/loop.py",
        '            log.warning("interrupted at iteration %d: saving a checkpoint", self.state.iteration)\n'
        "            self.checkpoint()\n"
        "            raise\n",
        '            log.warning("interrupted at iteration %d: saving a checkpoint", self.state.iteration)\n'
        "            raise\n",
        (f"{STOP_TEST}[inline-SIGINT]", f"{STOP_TEST}[inline-SIGTERM]"),
    ),
    Plant(
        "restart_from_scratch",
        "a restart continues from the newest intact checkpoint",
        "fleetrl/supervise/attempt.py",
        "if list_checkpoints(self.run_dir) and (restart or self.config.runner.resume) else None",
        "if list_checkpoints(self.run_dir) and self.config.runner.resume else None",
        (f"{RESTART_TEST}[inline]",),
    ),
    Plant(
        "teardown_takes_30_s",
        "every process of the run is gone within 10 s of an incident's detection",
        "fleetrl/watch/respond.py",
        "        finally:\n            kill_remote()\n",
        "        finally:\n            time.sleep(30)\n            kill_remote()\n",
        (
            "tests/test_fault_matrix.py::test_an_exception_in_the_first_env_reset_inline_is_named_at_once",
            "tests/test_supervisor.py::test_kill_9_of_the_controller_is_worker_died_and_nothing_is_left[inline]",
        ),
    ),
)
