"""A simulator's own server processes (tests/server_envs.py: Popen'd, forked, through a shell,
daemonised with setsid and a double fork) are its worker's: a server computing past the start-up
allowance keeps the waiting worker busy and the run trains to its end, and a server that never
answers is named in the report by pid, command, state, CPU and Python stack, on every backend (Ray
and fused: slow); and none outlives the run — whatever way it was started, also after kill -9 of the controller.

CI's cases shorten the start-up: `watchdog.startup_step_allowance_s` 3 s against a server that
computes 8 CPU seconds (the margin: 5 CPU seconds, many more of wall time on a loaded host). The
issue's own case — 90 CPU seconds against the default 60 s — is `slow`, one per backend."""

from __future__ import annotations

import pytest

from tests.incidents import SMALL
from tests.support import Fleetrl, controller_of, processes_alive, train, wait_for

STARTED_EVERY_WAY = "[daemon, fork, shell]"  # idle servers beside the Popen'd one the simulator waits on
BACKENDS = {
    "inline": (),
    "ray": ("cluster.backend=ray",),
    "fused": ("cluster.backend=ray", "cluster.fuse_collocated=true"),
}
TRAIN_TO_THE_END = [o for o in SMALL if not o.startswith("runner.total_env_steps")] + ["runner.total_env_steps=128"]


def servers(tmp_path, **kwargs) -> tuple[str, str]:
    """(the env.id and env.kwargs overrides of a ServerSimulator writing its servers' pids to a
    folder of `tmp_path`)."""
    pid_dir = tmp_path / "server-pids"
    pid_dir.mkdir()
    fields = ", ".join([f"pid_dir: {pid_dir}", *(f"{key}: {value}" for key, value in kwargs.items())])
    return "env.id=tests.server_envs:ServerSimulator", f"env.kwargs={{{fields}}}"


def server_pids(tmp_path) -> list[int]:
    return sorted(int(path.name) for path in (tmp_path / "server-pids").iterdir())


def start_up(tmp_path, backend: str, compute_s: float, allowance_s: float | None):
    allowance = [] if allowance_s is None else [f"watchdog.startup_step_allowance_s={allowance_s}"]
    result = train(
        "configs/ppo_cartpole.yaml",
        *TRAIN_TO_THE_END,
        *BACKENDS[backend],
        *servers(tmp_path, how="popen", compute_s=compute_s, idle=STARTED_EVERY_WAY),
        *allowance,
        runs=tmp_path / "runs",
        timeout=3 * compute_s + 240,  # the server gives up computing after 3 x compute_s of wall time
    ).succeeded()
    slow = [line for line in result.stderr.splitlines() if "slow: " in line and ".construct for" in line]
    # busy: the server computes, or on a host loaded past its cores waits for a CPU (starved)
    busy = ("which are computing", "which are starved")
    assert any(any(b in line for b in busy) and "sim_server.py" in line for line in slow), result.stderr[-4000:]
    pids = server_pids(tmp_path)
    assert len(pids) == 4, pids  # popen, daemon, fork and shell: each started, each gone
    assert processes_alive(pids) == [], processes_alive(pids)


# slow: a Ray cluster each (~70 s on a loaded host), over this share of CI; the evidence rule
# is inline's, and the matrix slice's hang cells on Ray hold that Ray's daemons are not evidence
SLOW_OFF_INLINE = [
    "inline",
    pytest.param("ray", marks=pytest.mark.slow),
    pytest.param("fused", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("backend", SLOW_OFF_INLINE)
def test_a_server_computing_past_the_startup_allowance_trains_to_the_end_and_ends_with_it(tmp_path, backend):
    start_up(tmp_path, backend, compute_s=8, allowance_s=3)


@pytest.mark.slow  # 90 CPU seconds of server start-up per backend (the CI cases shorten both bounds)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_90_s_server_start_up_trains_to_the_end_with_the_default_allowance(tmp_path, backend):
    start_up(tmp_path, backend, compute_s=90, allowance_s=None)


@pytest.mark.parametrize("backend", SLOW_OFF_INLINE)
def test_a_server_that_never_answers_is_named_with_its_pid_command_state_and_stack(tmp_path, backend):
    """Daemonised (setsid, a double fork): its parent is gone at once, yet it is the worker's."""
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        *BACKENDS[backend],
        *servers(tmp_path, how="daemon", answer="false"),
        "watchdog.startup_step_allowance_s=3",
        runs=tmp_path / "runs",
        timeout=180,
    )
    report = result.hang_report
    assert result.code == 4 and report["cause"] == "startup_timeout", result.stderr[-3000:]
    assert report["state"] == "blocked" and "is not computing either" in report["summary"], report["summary"]
    hung = [pid for pid in server_pids(tmp_path) if f"pid {pid} (`" in report["summary"]]
    assert len(hung) == 1, report["summary"]
    waited_on = report["waits_on"][0]
    assert waited_on["pid"] == hung[0] and waited_on["state"] == "S" and waited_on["cpu"] < 0.05, waited_on
    assert "tests/sim_server.py" in waited_on["command"] and waited_on["command"].endswith(" never"), waited_on
    assert "serve_forever (tests/sim_server.py:" in waited_on["stack"], waited_on["stack"]
    assert f"it waits on pid {hung[0]} (`" in (result.run_dir / "hang_report.txt").read_text()
    assert processes_alive(server_pids(tmp_path)) == []


@pytest.mark.parametrize("backend", ["inline", pytest.param("ray", marks=pytest.mark.slow)])
def test_kill_9_of_the_controller_leaves_no_simulator_server(tmp_path, backend):
    """The controller killed once training: its servers, daemonised ones included, are ended with
    the run. (Ray: slow, over this issue's share of CI; the supervisor's subreaper path is the same.)"""
    with Fleetrl(
        "train",
        "configs/ppo_cartpole.yaml",
        f"runner.run_dir={tmp_path / 'runs'}",
        *SMALL,
        *BACKENDS[backend],
        *servers(tmp_path, how="popen", idle=STARTED_EVERY_WAY),
        runs=tmp_path / "runs",
    ) as running:
        wait_for(running, "a first checkpoint", lambda: list(tmp_path.glob("runs/*/checkpoints/ckpt_*.pt")))
        assert len(server_pids(tmp_path)) == 4
        controller_of(running).kill()
        result = running.finish(timeout=120)
    assert result.code == 4 and result.hang_report["cause"] == "worker_died", result.stderr[-3000:]
    assert processes_alive(server_pids(tmp_path)) == []
