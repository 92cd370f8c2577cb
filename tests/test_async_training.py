"""Asynchronous training (`runner.asynchronous: true`, fleetrl/controller/async_updates.py): real
`fleetrl train` runs. Inline it runs the synchronous computation in the same order (one thread:
nothing overlaps), bit for bit without a correction, and trains CartPole; on Ray the rollout
collects the next batch while the actor ranks train, so samples are one version old, GRPO's
batches are acted by one version each, a checkpoint's queued batch is counted as dropped on a
resume and on a restart, the staleness bound drops and counts the batches older than it, and a stuck actor rank
is named with the controller waiting for it (behind a full queue, or for the last update).
Where asynchronous training means nothing, it is refused with exit 2 before anything starts."""

from __future__ import annotations

import shutil
import signal
import time

import pytest
import torch

from fleetrl.checkpoint import list_checkpoints, load_latest, sum_file, verified_load
from fleetrl.cli import main
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_unchecked
from fleetrl.plan.resolve import resolve
from tests.incidents import SMALL, STALL_S, assert_incident, fault, promised_detection_s
from tests.support import LEARNING_GUARD_S, REPO, TWO_ACTOR_RANKS_ON_RAY, Fleetrl, first_iteration, train

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
ASYNC = "runner.asynchronous=true"
FUSED = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
    "cluster.fuse_collocated=true",
]

REFUSED = {
    "an off-policy algorithm": ("configs/sac_pendulum.yaml", [ASYNC], "runner.asynchronous", "'sac'"),
    "PPG's auxiliary phase": ("configs/ppg_cartpole.yaml", [ASYNC], "runner.asynchronous", "'ppg'"),
    "fused ranks": (CARTPOLE, [ASYNC, *FUSED], "runner.asynchronous", "cluster.fuse_collocated"),
    "a bound every sync breaks": (
        CARTPOLE,
        ["runner.weight_sync_interval=4", "algorithm.max_staleness=1"],
        "algorithm.max_staleness",
        "runner.weight_sync_interval - 1 = 3",
    ),
}


@pytest.mark.parametrize("config, overrides, key, fragment", REFUSED.values(), ids=REFUSED.keys())
def test_asynchronous_training_is_refused_where_it_means_nothing(tmp_path, capsys, config, overrides, key, fragment):
    overrides = [*overrides, f"runner.run_dir={tmp_path / 'runs'}"]
    with pytest.raises(ConfigError) as raised:
        resolve(load_unchecked(str(REPO / config), overrides))
    assert raised.value.key == key and fragment in str(raised.value)
    assert main(["train", str(REPO / config), *overrides, "--dry-run"]) == 2
    assert capsys.readouterr().err == f"fleetrl: {raised.value}\n"
    assert not (tmp_path / "runs").exists()


def test_behaviour_cloning_refuses_it_too(capsys):
    config = str(REPO / "configs" / "sft_manipulation.yaml")
    assert main(["sft", config, ASYNC, "--dry-run"]) == 2
    assert "config error at 'runner.asynchronous': got True; expected false with algorithm.name 'bc'" in (
        capsys.readouterr().err
    )


def final_policy(run_dir) -> dict:
    return load_latest(run_dir)["actor"]["policy"]


def test_inline_it_is_the_synchronous_computation_bit_for_bit(tmp_path):
    """One thread: collect, train, collect, ... as the synchronous loop, every sample 0 versions
    old; without a correction the weights and losses are the synchronous run's exactly."""
    job = [*SMALL, "runner.total_env_steps=320", "algorithm.off_policy_correction=none"]
    sync = train(CARTPOLE, *job, runs=tmp_path / "sync").succeeded()
    overlapped = train(CARTPOLE, *job, ASYNC, runs=tmp_path / "async").succeeded()
    assert len(overlapped.metrics) == len(sync.metrics) == 5
    for mine, theirs in zip(overlapped.metrics, sync.metrics):
        for key in ("global_step", "policy_loss", "value_loss", "approx_kl", "lr"):
            assert mine[key] == theirs[key], key
        assert (mine["staleness_max"], theirs["staleness_max"]) == (0, 0)
    mine, theirs = final_policy(overlapped.run_dir), final_policy(sync.run_dir)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)
    assert overlapped.summary["staleness"] == {"0": 320} and overlapped.summary["samples_dropped"] == 0


def test_inline_the_interpolated_proximal_policy_is_exact_and_the_run_is_the_uncorrected_one(tmp_path):
    """`algorithm.proximal_logprob: loglinear`: inline every sample is 0 versions old, so the
    interpolated proximal policy is the acting one exactly (α = 0) and no forward pass runs: the
    run trains as the one without a correction, bit for bit, and reports the decoupled
    objective's metrics beside it (every weight 1, none truncated)."""
    job = [*SMALL, "runner.total_env_steps=320", ASYNC]
    plain = train(CARTPOLE, *job, "algorithm.off_policy_correction=none", runs=tmp_path / "plain").succeeded()
    interpolated = train(CARTPOLE, *job, "algorithm.proximal_logprob=loglinear", runs=tmp_path / "loglinear")
    interpolated.succeeded()
    assert len(interpolated.metrics) == len(plain.metrics) == 5
    for mine, theirs in zip(interpolated.metrics, plain.metrics):
        for key in ("global_step", "policy_loss", "value_loss", "approx_kl", "clip_fraction", "staleness_max"):
            assert mine[key] == theirs[key], key
        assert (mine["importance_weight_mean"], mine["importance_truncated"]) == (1.0, 0.0)
        assert "importance_weight_mean" not in theirs
    mine, theirs = final_policy(interpolated.run_dir), final_policy(plain.run_dir)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)


def test_async_ppo_trains_cartpole_to_475_inline(tmp_path):
    result = train(
        CARTPOLE, ASYNC, "runner.target_return=475", "--skip-doctor", runs=tmp_path, timeout=LEARNING_GUARD_S
    ).succeeded()
    summary = result.summary
    assert summary["target_reached"], summary
    assert set(summary["staleness"]) == {"0"} and summary["samples_dropped"] == 0
    assert result.metrics[-1]["importance_weight_mean"] == pytest.approx(1.0, abs=1e-4)  # the decoupled objective ran


# GRPO on CartPole, short: 8 envs in groups of 4, 25-step episodes in 25-step iterations
SMALL_GRPO = [
    "env.num_envs=8",
    "env.max_episode_steps=25",
    "algorithm.num_steps=25",
    "algorithm.minibatch_size=100",
    "algorithm.update_epochs=2",
    "runner.tensorboard=false",
    "--skip-doctor",
]


def test_on_ray_grpo_collects_while_the_actor_trains_a_stop_settles_and_a_resume_drops_the_queue(tmp_path):
    """Two DDP actor ranks on Ray, GRPO: every batch after the first was collected while the
    update before it ran, so its samples are one version old — never more than
    `async_queue_batches` — and each batch was acted by one version (a group's members too).
    Checkpoint 3 holds the batch collected during update 3 as in flight, not saved. SIGTERM: the
    update in flight finishes and is recorded before the checkpoint, whose count and weights then
    agree. A resume from checkpoint 3 (inline: a checkpoint is the same anywhere) counts the
    queued batch as dropped and collects its steps again."""
    config, runs = str(REPO / "configs" / "ppo_cartpole_grpo.yaml"), tmp_path / "ray"
    batch = 8 * 25
    # every checkpoint kept: on a loaded host the run may pass iteration 6 before SIGTERM lands, and
    # the default rotation (3) would then have deleted checkpoint 3
    job = [*SMALL_GRPO, ASYNC, "runner.checkpoint_interval=3", "runner.keep_checkpoints=100"]
    with Fleetrl("train", config, *job, *TWO_ACTOR_RANKS_ON_RAY, f"runner.run_dir={runs}", runs=runs) as running:
        metrics = first_iteration(runs, running) / "metrics.jsonl"
        while len(metrics.read_text().splitlines()) < 5:
            assert running.process.poll() is None, running.stderr_so_far()[-3000:]
            time.sleep(0.5)
        running.process.send_signal(signal.SIGTERM)
        result = running.finish(timeout=180)
    assert result.code == 143, result.stderr[-3000:]
    ages = [(r["staleness_mean"], r["staleness_max"]) for r in result.metrics]
    assert ages[0] == (0, 0) and all(age == (1, 1) for age in ages[1:]), ages  # one version per batch, one behind
    assert all(r["weight_syncs"] in (0, 1) and r["queue_depth"] <= 1 for r in result.metrics)
    third, stopped = list_checkpoints(result.run_dir)[0], list_checkpoints(result.run_dir)[-1]
    saved = verified_load(third)
    assert saved["iteration"] == 3 and saved["in_flight_samples"] == batch
    assert saved["global_step"] == 3 * batch  # the queued batch's env steps are not counted
    last = verified_load(stopped)
    iterations = len(result.metrics)
    # A clean stop: no report, and the summary written (a stop that split an update's submission
    # between the ranks once left rank 0 alone in its collectives: reported, killed, no summary)
    assert result.summary is not None and result.hang_report is None, (
        (result.hang_report or {}).get("summary"),
        result.stderr[-3000:],
    )
    assert last["iteration"] == iterations == result.summary["iterations"]  # the update in flight was recorded
    assert last["global_step"] == iterations * batch and sum(last["staleness"].values()) == iterations * batch
    for later in list_checkpoints(result.run_dir)[1:]:
        later.unlink()
        sum_file(later).unlink()
    resumed = train(
        config,
        *job,
        "runner.total_env_steps=1200",
        f"runner.resume={result.run_dir}",
        "cluster.backend=inline",
        runs=runs,
        timeout=300,
    ).succeeded()
    records = resumed.metrics[-3:]  # the resumed run's: metrics.jsonl goes on in the same run directory
    assert [r["iteration"] for r in records] == [4, 5, 6]
    assert records[0]["global_step"] == 4 * batch and records[0]["samples_dropped"] == batch
    assert resumed.summary["samples_dropped"] == batch
    assert f"{batch} samples were collected and not yet trained when checkpoint 3 was taken" in resumed.stderr


STUCK_UPDATE_WAITS = {  # the controller's wait behind actor rank 1 stuck in its third update: (env steps, phase, why)
    "the queue full": (1_000_000, "async.queue_full", "an update, with the queue of collected batches full"),
    "the last update": (3 * 64, "async.drain", "the last updates, with nothing left to collect"),
}


@pytest.mark.parametrize("total_env_steps, wait, why", STUCK_UPDATE_WAITS.values(), ids=STUCK_UPDATE_WAITS.keys())
def test_a_stuck_actor_rank_is_named_with_the_controller_waiting_for_it(tmp_path, total_env_steps, wait, why):
    """Actor rank 1 hangs in its third update; rank 0 waits in the gradient all-reduce. With
    more to collect, the controller has collected the next batch and waits with the queue full;
    when the third batch (64 env steps each) is the last, it waits in the drain. Either way the
    rank behind is named — not its peer, not the controller, not the idle env and rollout
    workers — and the report says the controller waits for it in that wait."""
    shutil.rmtree(tmp_path, ignore_errors=True)
    result = train(
        CARTPOLE,
        *SMALL,
        ASYNC,
        *TWO_ACTOR_RANKS_ON_RAY,
        f"runner.total_env_steps={total_env_steps}",
        fault("hang", "actor", 1, 3),
        runs=tmp_path,
        timeout=240,
    )
    assert_incident(result, "rank_missing_from_collective", ["actor", 1], STALL_S)
    report = result.hang_report
    assert f"; controller rank 0 waits for it in {wait}: {why}" in report["summary"]
    workers = {(w["component"], w["rank"]): w for w in report["workers"]}
    assert workers[("controller", 0)]["waits_for_culprit"] and workers[("controller", 0)]["phase"] == wait
    assert workers[("actor", 0)]["waits_for_culprit"]
    assert not workers[("env", 0)]["culprit"] and not workers[("rollout", 0)]["culprit"]


def test_the_staleness_bound_drops_and_counts_the_batches_older_than_it(tmp_path):
    """On Ray with `runner.weight_sync_interval: 2` a sample may be 2 versions old (the queue's 1
    and the interval's 1), and `algorithm.max_staleness: 1` admits 1. Batches of 64 env steps:
    B0 acts with version 0 and is trained at 0; B1, collected during update 1, at 1; B2,
    collected during update 2 while version 2's weights queue behind it, still acts with
    version 0 and would be trained at 2: dropped, its 64 samples counted; B3 acts with version 2
    and is trained at 2, B4 at 3, B5 (version 2 again) would be at 4: dropped; B6 at 4. Seven
    collections, five updates, 128 samples dropped, none trained older than the bound; the
    env steps of a dropped batch count as spent. The proximal policy is interpolated by age
    (`algorithm.proximal_logprob: loglinear`): the ages reach the actor over Ray, so a batch of
    age 0 is weighed by exactly 1 (α = 0) and a batch of age 1 is not."""
    result = train(
        CARTPOLE,
        *SMALL,
        ASYNC,
        "cluster.backend=ray",
        "runner.weight_sync_interval=2",
        "algorithm.max_staleness=1",
        "algorithm.proximal_logprob=loglinear",
        f"runner.total_env_steps={7 * 64}",
        runs=tmp_path,
        timeout=240,
    ).succeeded()
    records = result.metrics
    assert [r["staleness_max"] for r in records] == [0, 1, 0, 1, 0], records
    weights = [(r["importance_weight_mean"], r["importance_truncated"]) for r in records]
    assert [weight == (1.0, 0.0) for weight in weights] == [True, False, True, False, True], weights
    assert [r["samples_dropped"] for r in records] == [0, 0, 64, 64, 128]
    # env steps through the batch trained, the dropped batches before it included (they were spent)
    assert [r["global_step"] for r in records] == [64, 128, 256, 320, 448]
    assert result.summary["staleness"] == {"0": 3 * 64, "1": 2 * 64} and result.summary["samples_dropped"] == 128
    assert "dropped 128" in result.stdout + result.stderr  # the console line says so


@pytest.mark.slow  # ~95 s on a loaded host: a Ray run, a restart, a second Ray run
def test_a_restart_resumes_the_checkpoint_counts_its_queued_batch_as_dropped_and_goes_on(tmp_path):
    """On Ray the simulator crashes once, in the sixth collection (each env's 85th step, 16 a
    collection), made while update 5 trains. The supervisor restarts the controller from
    checkpoint 4, which held the batch collected during update 4 as in flight: the resumed run
    counts its 64 samples as dropped, collects them again, and goes on to the budget's tenth
    update — one record per iteration, in order, the env steps of each continuing the last's."""
    marker = tmp_path / "crashed"
    result = train(
        CARTPOLE,
        *SMALL,
        ASYNC,
        "cluster.backend=ray",
        "env.id=tests.supervisor_envs:CrashOnce",
        f"env.kwargs={{marker: {marker}, at_step: {5 * 16 + 5}}}",
        "runner.max_restarts=1",
        "runner.checkpoint_interval=4",
        f"runner.total_env_steps={10 * 64}",
        runs=tmp_path / "runs",
        timeout=300,
    ).succeeded()
    summary, records = result.summary, result.metrics
    assert marker.exists()
    assert summary["restarts"] == 1 and summary["restart_causes"] == ["worker_exception"], summary
    assert [r["iteration"] for r in records] == list(range(1, 11))
    assert [r["global_step"] for r in records] == [64 * i for i in range(1, 11)]
    (first_after,) = [r for r in records if "restarts" in r]
    assert first_after["iteration"] == 5 and first_after["samples_dropped"] == 64, first_after
    assert summary["samples_dropped"] == 64 and sum(summary["staleness"].values()) == 10 * 64, summary
    assert "64 samples were collected and not yet trained when checkpoint 4 was taken" in result.stderr


MARKED_STEP_S = 1.0  # each step of the collection the update fails in: 2 envs x 8 steps = 16 s of it left


def test_an_update_that_fails_during_a_collection_is_reported_at_once(tmp_path):
    """Actor rank 1 fails the first update (which rank 0 cannot finish without it: the gradient
    all-reduce), and only once the env has begun the next collection: the env writes a marker at
    its first step of it (tests/envs.py `MarksACollection`) and rank 1's network raises only when
    it sees the marker (tests/fault_models.py `FailsOnMarkNet`), so the update fails inside the
    overlapped collection whatever the host's load. From the marker on each env step takes a
    second: ~16 s of the collection are left when the update fails. The collection gives up at
    once and rank 1's own exception is the incident, within the exception bound and the loaded
    host's margin (6 s) — not when the collection would have ended, nor as rank 0's wait in the
    collective."""
    marker = tmp_path / "second-collection-began"
    result = train(
        CARTPOLE,
        *SMALL,
        ASYNC,
        *TWO_ACTOR_RANKS_ON_RAY,
        "env.id=tests.envs:MarksACollection",
        f"env.kwargs={{marker: '{marker}', at: 9, step_time_s: {MARKED_STEP_S}}}",  # step 9: the 2nd collection's first
        "env.num_envs=2",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=16",
        "model.id=tests.fault_models:FailsOnMarkNet",
        f"model.kwargs={{marker: '{marker}', on_rank: 1}}",
        "--skip-doctor",
        runs=tmp_path / "runs",
        timeout=240,
    )
    assert_incident(result, "worker_exception", ["actor", 1], promised_detection_s("exception"))
    assert result.hang_report["summary"] == (
        "actor rank 1 raised UpdateFailed in actor.train: the update failed while the next collection was under way"
    )
    assert marker.read_text() == "env 0 step 9"  # the run's env worker, at its 2nd collection's first step


@pytest.mark.slow  # ~4 min on a loaded 2-core host: a Ray cluster, then ~170k env steps
def test_async_ppo_trains_cartpole_to_475_on_ray(tmp_path):
    """The overlapped loop on Ray learns: one env, rollout and actor worker, every batch after the
    first one version old, corrected by the decoupled objective."""
    result = train(
        CARTPOLE,
        ASYNC,
        "cluster.backend=ray",
        "runner.target_return=475",
        "runner.total_env_steps=400000",
        "runner.tensorboard=false",
        "--skip-doctor",
        runs=tmp_path,
        timeout=LEARNING_GUARD_S,
    ).succeeded()
    summary = result.summary
    assert summary["target_reached"], summary
    assert summary["staleness"]["0"] == 256 and max(int(age) for age in summary["staleness"]) <= 1
    assert summary["samples_dropped"] == 0


@pytest.mark.slow  # ~3 min: a Ray cluster, 2 FSDP ranks of a PaliGemma with LoRA, a rollout of its own
def test_async_fine_tuning_of_a_vla_with_lora_on_fsdp_ranks(tmp_path, tiny_paligemma):
    """configs/ppo_minigrid_vla.yaml's tiny PaliGemma, LoRA adapters, 2 FSDP actor ranks and a
    rollout worker sent patches (`runner.weight_sync: trainable`): the proximal pass gathers the
    shards on every rank alike, every batch after the first is one version old, and the first
    sync is the only full one."""
    result = train(
        REPO / "configs" / "ppo_minigrid_vla.yaml",
        ASYNC,
        f"model.path={tiny_paligemma}",
        "model.lora.rank=4",
        "actor.strategy=fsdp",
        "env.num_envs=4",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=16",
        "runner.total_env_steps=160",
        *TWO_ACTOR_RANKS_ON_RAY,
        "--skip-doctor",
        runs=tmp_path,
        timeout=600,
    ).succeeded()
    assert [r["staleness_max"] for r in result.metrics] == [0, 1, 1, 1, 1]
    assert all(r["importance_weight_mean"] > 0 for r in result.metrics)
    assert result.summary["samples_dropped"] == 0


ASYNC_CELLS = {  # (where, kind, method, call, cause, detection): a fault in the overlapped loop's collection
    "an env worker hung in a step": ("env", "hang", "step", 40, "phase_timeout", "stall"),
    "a rollout worker that raises": ("rollout", "exception", "act", 40, "worker_exception", "exception"),
    "an env worker killed": ("env", "kill", "step", 40, "worker_died", "death"),
}


@pytest.mark.slow  # ~1 min each: a Ray cluster
@pytest.mark.parametrize("where, kind, method, call, cause, detection", ASYNC_CELLS.values(), ids=ASYNC_CELLS.keys())
def test_a_collector_fault_in_the_overlapped_loop_is_named(tmp_path, where, kind, method, call, cause, detection):
    """While the actor trains, the controller waits in `async.collect`: a fault of the env or
    rollout worker it waits for is that worker's, named within the bound (a hang: with the
    controller waiting for it)."""
    debug = f"debug.fault={{kind: {kind}, component: {where}, rank: 0, method: {method}, call: {call}}}"
    result = train(CARTPOLE, *SMALL, ASYNC, "cluster.backend=ray", debug, runs=tmp_path, timeout=240)
    assert_incident(result, cause, [where, 0], promised_detection_s(detection))
    report = result.hang_report
    if kind == "hang":  # the controller is still in its wait, for the worker named
        controller = next(w for w in report["workers"] if w["component"] == "controller")
        assert controller["phase"] == "async.collect" and controller["waits_for_culprit"], controller
