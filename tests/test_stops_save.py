"""A stop saves: SIGTERM or Ctrl-C (SIGINT) sent to `fleetrl train` in the middle of an update,
with checkpoints far apart (`runner.checkpoint_interval` 1000), writes a new checkpoint of the
iteration under way, exits 143 / 130, and a resume from that checkpoint continues exactly: every
number of every iteration and the final weights equal those of the run never stopped, bit for bit.

The update is caught in the middle by its own network (tests/fault_models.py `MidUpdateNet`): at
its 10th training forward — the second of iteration 3's four (2 epochs x 2 minibatches) — it
writes a marker file and waits; the test sends the signal then, and lets the update go on. The
env is MetronomeEnv, whose episodes end on the iteration boundary (the simulator is not
checkpointed: a resume resets it, where the uninterrupted run's would be anyway), and the
schedules are flat, so that the runs of different lengths compare.

On each backend the stop takes another path: inline the signal's exception lands in the update
itself; on Ray the controller's wait for the actor is what it interrupts, the actor's update going
on in its process; on fused ranks the update runs in the ranks' processes, the env steps too.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from fleetrl.checkpoint import list_checkpoints, load_latest
from fleetrl.controller.loop import Trainer
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.tracking.jsonl import read_metrics
from tests.support import REPO, TIMING_METRICS, Fleetrl, train

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
ITERATIONS = 6
STEPS_PER_ITERATION = 64  # 4 envs x 16 steps
MARKED_FORWARD = 10  # iteration 3's second training forward (4 an iteration)
STOPPED_IN = 3  # the iteration under way when the signal comes
EXACT = [
    "env.id=tests.envs:MetronomeEnv",
    "env.kwargs={length: 16}",
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "algorithm.anneal_lr=false",
    "algorithm.anneal_clip=false",
    "runner.tensorboard=false",
    "runner.seed=3",
    "runner.checkpoint_interval=1000",
    f"runner.total_env_steps={ITERATIONS * STEPS_PER_ITERATION}",
    "model.id=tests.fault_models:MidUpdateNet",
]
BACKENDS = {
    "inline": [],
    "ray": ["cluster.backend=ray", "cluster.component_placement={actor: 0, env: 0, rollout: 0}"],
    "fused": [
        "cluster.backend=ray",
        "cluster.component_placement={actor: 0, env: 0, rollout: 0}",
        "cluster.fuse_collocated=true",
    ],
}
CASES = [("inline", signal.SIGINT), ("inline", signal.SIGTERM), ("ray", signal.SIGTERM), ("fused", signal.SIGINT)]


def untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_METRICS} for r in records]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run never stopped, on the backend `backend` draws the same numbers as: its metrics and
    final checkpoint. Inline and one fused rank draw alike (one process, one generator), and run
    here; a Ray rollout worker draws its action noise in a process of its own."""
    made: dict[str, tuple[list[dict], dict]] = {}

    def of(backend: str) -> tuple[list[dict], dict]:
        twin = "ray" if backend == "ray" else "inline"
        if twin not in made:
            runs = tmp_path_factory.mktemp(f"uninterrupted-{twin}")
            overrides = [*EXACT, *BACKENDS[twin], "model.kwargs={at: 0}"]
            if twin == "inline":
                config = load_config(CARTPOLE, [*overrides, f"runner.run_dir={runs}"])
                run_dir = Path(Trainer(resolve(config), live_progress=False).train()["run_dir"])
            else:
                run_dir = train(CARTPOLE, *overrides, "--skip-doctor", runs=runs).succeeded().run_dir
            made[twin] = (untimed(read_metrics(run_dir)), load_latest(run_dir))
        return made[twin]

    return of


def wait_for(path: Path, running: Fleetrl, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert running.process.poll() is None, "the run ended before the marked update: " + running.stderr_so_far()
        assert time.monotonic() < deadline, "no marked update: " + running.stderr_so_far()[-3000:]
        time.sleep(0.05)


@pytest.mark.usefixtures("quiet_fleetrl_logging")
@pytest.mark.parametrize(("backend", "signum"), CASES, ids=[f"{b}-{s.name}" for b, s in CASES])
def test_a_stop_mid_update_saves_the_iteration_and_the_resume_is_the_uninterrupted_run(
    tmp_path, uninterrupted, backend, signum
):
    runs, marker = tmp_path / "runs", tmp_path / "mid-update"
    marked = f"model.kwargs={{marker: {marker}, at: {MARKED_FORWARD}}}"
    command = ["train", CARTPOLE, *EXACT, *BACKENDS[backend], marked, f"runner.run_dir={runs}", "--skip-doctor"]
    with Fleetrl(*command, runs=runs) as running:
        wait_for(marker, running)
        running.process.send_signal(signum)
        time.sleep(0.5)  # the signal is in before the update goes on
        marker.unlink()
        stopped = running.finish(timeout=120)
    assert stopped.code == 128 + signum, stopped.stderr[-3000:]
    assert stopped.hang_report is None and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    # one checkpoint, the stop's (the periodic ones are 1000 iterations apart), of the iteration
    # under way, with its record beside it
    checkpoints = list_checkpoints(stopped.run_dir)
    assert len(checkpoints) == 1, (
        f"not one checkpoint, the stop's: {[c.name for c in checkpoints]}\n" + stopped.stderr[-2000:]
    )
    (checkpoint,) = checkpoints
    saved = load_latest(stopped.run_dir)
    assert saved["iteration"] == STOPPED_IN and saved["global_step"] == STOPPED_IN * STEPS_PER_ITERATION, checkpoint
    assert [r["iteration"] for r in stopped.metrics] == list(range(1, STOPPED_IN + 1))
    assert sum(env["env_steps"] for env in saved["env"]) == saved["global_step"]  # the env workers' counters agree
    assert stopped.summary["iterations"] == STOPPED_IN
    assert f"stopped by {signum.name}; the newest intact checkpoint is {checkpoint}" in stopped.stderr

    resumed = train(
        CARTPOLE,
        *EXACT,
        *BACKENDS[backend],
        "model.kwargs={at: 0}",
        f"runner.resume={stopped.run_dir}",
        "--skip-doctor",
        runs=runs,
    ).succeeded()
    records, final = uninterrupted(backend)
    assert untimed(resumed.metrics) == records
    mine = load_latest(resumed.run_dir)["actor"]
    for key, tensor in final["actor"]["policy"].items():
        torch.testing.assert_close(mine["policy"][key], tensor, rtol=0, atol=0, msg=key)
    for index, state in final["actor"]["optimizer"]["state"].items():
        for name, tensor in state.items():
            torch.testing.assert_close(mine["optimizer"]["state"][index][name], tensor, rtol=0, atol=0)
