"""SAC: the replay buffer, the update's pieces, 2 DDP ranks against one process, and end to end.

The multi-process checks spawn two real ranks (Gloo on 127.0.0.1, `tests.sac_support`); the end
to end ones run `fleetrl train configs/sac_pendulum.yaml` (small networks, a few thousand steps)
and resume it with and without the replay buffer in the checkpoint.
"""

from __future__ import annotations

import copy
import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from fleetrl.algos.common.optim import FUSED_KERNELS, FusedAdamStep
from fleetrl.algos.common.replay import ReplayBuffer
from fleetrl.algos.sac.actor import SACActorWorker
from fleetrl.algos.sac.learner import polyak_
from fleetrl.algos.sac.networks import SquashedGaussianActor
from fleetrl.algos.sac.rollout import SACRolloutWorker
from fleetrl.cluster.exchange.collect import Collector
from fleetrl.cluster.groups import InlineGroup
from fleetrl.config.schema import EnvConfig
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_config
from fleetrl.plan.rules import check_spaces
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.eval_worker import play
from fleetrl.workers.rollout_worker import RolloutWorker
from tests import sac_support
from tests.compare import max_difference
from tests.ranks import each_scenario, spawn_ranks
from tests.support import REPO, fleetrl, train

# ------------------------------------------------------------------------------ replay buffer


class ReferenceReplay:
    """The obvious implementation: every transition with its own copy of the next observation."""

    def __init__(self, capacity: int, envs: int):
        self.capacity, self.envs = capacity, envs
        self.columns: list[list[tuple]] = [[] for _ in range(envs)]

    def add(self, obs, actions, rewards, terminated, next_obs):
        for t in range(len(obs)):
            for e in range(self.envs):
                column = self.columns[e]
                column.append((obs[t, e], actions[t, e], rewards[t, e], not terminated[t, e], next_obs[t, e]))
                del column[: -self.capacity]


def random_stream(steps: int, envs: int, generator: np.random.Generator):
    """Per-env episodes with random ends: obs[t+1] is the reset obs after an end, next_obs the true
    successor (a different, 'final' observation on truncation)."""
    obs = generator.normal(size=(steps + 1, envs, 2)).astype(np.float32)
    terminated = generator.random((steps, envs)) < 0.08
    truncated = (generator.random((steps, envs)) < 0.12) & ~terminated
    next_obs = obs[1:].copy()
    next_obs[truncated] = generator.normal(size=(int(truncated.sum()), 2))
    actions = generator.uniform(-1, 1, size=(steps, envs, 1)).astype(np.float32)
    rewards = generator.normal(size=(steps, envs)).astype(np.float32)
    return obs[:-1], actions, rewards, terminated, truncated, next_obs


def assert_same_contents(replay: ReplayBuffer, reference: ReferenceReplay) -> None:
    """Every stored transition (row s·E + e, slots in ring order) against the reference."""
    E, C = replay.num_envs, replay.capacity
    assert len(replay) == sum(len(c) for c in reference.columns)
    oldest = replay.head if replay.slots == C else 0
    for e in range(E):
        for k, (obs, action, reward, alive, next_obs) in enumerate(reference.columns[e]):
            row = ((oldest + k) % C) * E + e
            got = replay.gather(torch.tensor([row]))
            np.testing.assert_array_equal(got[0][0].numpy(), obs)
            np.testing.assert_array_equal(got[1][0].numpy(), action)
            assert got[2][0].item() == reward and got[3][0].item() == float(alive)
            if alive:  # a terminated transition's next obs is never used (masked)
                np.testing.assert_array_equal(got[4][0].numpy(), next_obs)


def test_replay_buffer_matches_a_list_of_transitions_through_wraparound_and_episode_ends():
    """Random episode ends over many wrap-arounds, a final-observation store that must grow
    (initial room for 2), and the state_dict round trip along the way."""
    generator = np.random.default_rng(0)
    replay = ReplayBuffer(capacity=13, num_envs=3, obs_shape=(2,), action_shape=(1,), final_capacity=2)
    reference = ReferenceReplay(13, 3)
    pending = None
    for iteration in range(30):
        obs, actions, rewards, terminated, truncated, next_obs = random_stream(4, 3, generator)
        if pending is not None and iteration % 7:  # the stream continues where it stopped
            obs[0] = pending
        pending = next_obs[-1].copy()  # iterations 7, 14, ...: a reset in between (a resume)
        replay.add(obs, actions, rewards, terminated, truncated, next_obs)
        reference.add(obs, actions, rewards, terminated, next_obs)
        assert_same_contents(replay, reference)
        if iteration % 5 == 4:  # checkpoint round trip into a fresh buffer
            restored = ReplayBuffer(13, 3, (2,), (1,))
            restored.load_state_dict(replay.state_dict())
            replay = restored
            assert_same_contents(replay, reference)
    assert replay.final_capacity > 2  # it grew
    assert replay.final_count < 13 * 3  # and dead final observations were released


def test_replay_next_obs_is_the_next_slot_except_on_truncation():
    replay = ReplayBuffer(capacity=8, num_envs=1, obs_shape=(1,), action_shape=(1,))
    obs = np.array([[[0.0]], [[1.0]], [[10.0]]], np.float32)  # step 1 truncates: 10 is a reset obs
    next_obs = np.array([[[1.0]], [[2.0]], [[11.0]]], np.float32)  # 2: the truncated episode's final obs
    terminated = np.array([[False], [False], [False]])
    truncated = np.array([[False], [True], [False]])
    replay.add(obs, np.zeros((3, 1, 1)), np.ones((3, 1)), terminated, truncated, next_obs)
    got_next = replay.gather(torch.arange(3))[4][:, 0].tolist()
    assert got_next == [1.0, 2.0, 11.0]
    assert replay.next_index[0] == 1  # by index: the next slot, no copy
    assert replay.next_index[1] >= replay.final_base  # the final observation, kept apart
    assert replay.next_index[2] == replay.pending_base  # the newest: the pending observation
    # the next iteration continues from 11: the pending pointer becomes the next slot
    replay.add(
        np.array([[[11.0]]], np.float32),
        np.zeros((1, 1, 1)),
        np.ones((1, 1)),
        np.array([[True]]),
        np.array([[False]]),
        np.array([[12.0]], np.float32)[None],
    )
    assert replay.next_index[2] == 3
    alive = replay.gather(torch.tensor([3]))[3]
    assert alive.item() == 0.0  # terminated: the bootstrap is masked


def test_replay_buffer_is_plain_state_not_a_module_buffer():
    config = sac_support.config_for("plain")
    worker = SACActorWorker(config, *sac_support.spaces())
    assert not isinstance(worker.replay, nn.Module)
    for name, module in worker.replicated_modules().items():
        assert list(module.buffers()) == [], name  # nothing DDP would broadcast or sync
        assert not any(isinstance(v, ReplayBuffer) for v in vars(module).values()), name


# ------------------------------------------------------------------------------- the update


def test_polyak_average():
    target = [torch.full((3,), 1.0), torch.full((2, 2), -2.0)]
    source = [torch.full((3,), 3.0), torch.full((2, 2), 2.0)]
    polyak_(target, source, 0.25)
    assert torch.allclose(target[0], torch.full((3,), 0.75 * 1 + 0.25 * 3))
    assert torch.allclose(target[1], torch.full((2, 2), 0.75 * -2 + 0.25 * 2))
    polyak_(target, source, 1.0)  # tau 1: a copy
    assert all(torch.equal(t, s) for t, s in zip(target, source))


def test_targets_follow_the_critics_by_polyak_every_target_network_frequency_steps():
    config = sac_support.config_for("delayed_clipped")  # tau 0.05, targets every 2nd step
    worker = SACActorWorker(config, *sac_support.spaces())
    expected = [p.detach().clone() for p in worker.critic_target.parameters()]
    assert all(torch.equal(e, p) for e, p in zip(expected, worker.critic.parameters()))  # start equal
    for step, batch in enumerate(sac_support.make_batches(config)):
        worker.learner.update(batch)
        if (step + 1) % 2 == 0:
            expected = [(1 - 0.05) * e + 0.05 * p.detach() for e, p in zip(expected, worker.critic.parameters())]
        for e, t in zip(expected, worker.critic_target.parameters()):
            assert torch.allclose(e, t, atol=1e-6), step


@pytest.mark.parametrize("target_entropy, direction", [(5.0, 1), (-20.0, -1)])
def test_autotune_raises_alpha_below_the_target_entropy_and_lowers_it_above(target_entropy, direction):
    config = sac_support.config_for("plain")
    config.algorithm.target_entropy = target_entropy
    worker = SACActorWorker(config, *sac_support.spaces())
    before = worker.entropy.log_alpha.item()
    for batch in sac_support.make_batches(config):
        worker.learner.update(batch)
    change = worker.entropy.log_alpha.item() - before
    assert change * direction > 0, change


def test_squashed_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, [16], "relu", np.array([-2.0, -1.0]), np.array([2.0, 1.0]))
    obs, noise = torch.randn(64, 3), torch.randn(64, 2)
    actions, log_prob = actor(obs, noise)
    mean, log_std = actor.distribution(obs)
    u = mean + log_std.exp() * noise
    normal = torch.distributions.Normal(mean, log_std.exp())
    expected = (normal.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    assert torch.allclose(actions, torch.tanh(u))
    assert torch.allclose(log_prob, expected, atol=1e-4)
    assert actor.to_env(torch.tensor([[-1.0, 1.0], [0.0, 0.0]])).tolist() == [[-2.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("kernels", [True, False], ids=["private-kernels", "fallback"])
@pytest.mark.parametrize(
    "optimizer_class, weight_decay", [(torch.optim.Adam, 0.0), (torch.optim.Adam, 0.01), (torch.optim.AdamW, 0.01)]
)
def test_fused_adam_step_is_bitwise_the_optimizers_own_step(optimizer_class, weight_decay, kernels):
    """With torch's private fused kernels (where this torch has them: `FUSED_KERNELS`) and with
    the fallback to the optimizer's own step, the same parameters bit for bit."""
    assert FUSED_KERNELS  # the pinned torch has them: the fast path is the one tested

    torch.manual_seed(0)
    mine = [torch.randn(5, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    theirs = [t.detach().clone().requires_grad_() for t in mine]

    def make(params):
        groups = [{"params": params[:1], "lr": 0.01}, {"params": params[1:], "lr": 0.02}]
        return optimizer_class(groups, eps=1e-8, weight_decay=weight_decay, fused=True)

    reference, optimizer = make(theirs), make(mine)
    step = FusedAdamStep(optimizer, kernels=kernels)
    for i in range(7):
        grads = [torch.randn_like(t) for t in mine]
        if i in (0, 4):  # a parameter the loss did not reach: no state yet, then a skipped update
            grads[1] = None
        for params in (mine, theirs):
            for t, g in zip(params, grads):
                t.grad = None if g is None else g.clone()
        reference.step()
        step()
        if i == 2:  # a schedule changes the rate; a checkpoint is loaded (the step notices by itself)
            for opt in (reference, optimizer):
                opt.param_groups[0]["lr"] = 0.003
            optimizer.load_state_dict(copy.deepcopy(reference.state_dict()))
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs)), i
    assert optimizer.state[mine[0]]["step"].item() == 7
    assert optimizer.state[mine[1]]["step"].item() == 5


def test_bfloat16_matmuls_stay_close_to_float32():
    updates = {}
    for dtype in ("float32", "bfloat16"):
        config = sac_support.config_for("plain")
        config.algorithm.matmul_dtype = dtype
        worker = SACActorWorker(config, *sac_support.spaces())
        for batch in sac_support.make_batches(config, 3):
            worker.learner.update(batch)
        updates[dtype] = torch.cat([p.detach().flatten() for p in worker.critic.parameters()])
    initial = torch.cat(
        [
            p.detach().flatten()
            for p in SACActorWorker(sac_support.config_for("plain"), *sac_support.spaces()).critic.parameters()
        ]
    )
    moved = (updates["float32"] - initial).norm()  # how far 3 updates move the critics ...
    differs = (updates["bfloat16"] - updates["float32"]).norm()  # ... against the rounding's effect
    assert 0 < differs < 0.1 * moved, (differs, moved)


# ------------------------------------------------------------------------ rollout + collect


def test_sac_lanes_record_the_true_next_observation_and_ppo_lanes_do_not():
    """CountingEnv: env 0 never ends by itself (a time limit of 3 truncates it), env 1
    terminates after 2 steps. Observations are [env, episode, step]."""
    config = EnvConfig(
        id="tests.envs:CountingEnv",
        num_envs=2,
        max_episode_steps=3,
        kwargs={"lengths": [5, 2], "terminal": [False, True]},
    )
    box = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    env = EnvWorker(config, 0.99, seed=0)
    try:
        actor = SquashedGaussianActor(3, 1, [8], "relu", box.low, box.high)
        rollout = SACRolloutWorker(actor)
        rollout.configure_lanes([2], 8, env.observation_space, box)
        collector = Collector(InlineGroup([], [env]), InlineGroup([], [rollout]), 1, 8)
        collector.start(0)
        trajectory = collector.collect()
    finally:
        env.close()
    obs, next_obs = trajectory.obs.numpy(), trajectory.next_obs.numpy()
    # env 0: truncated at its 3rd step: next obs is the final one (step 3), obs[t+1] the reset
    assert next_obs[2, 0].tolist() == [0, 0, 3] and obs[3, 0].tolist() == [0, 1, 0]
    assert bool(trajectory.dones[2, 0]) and not bool(trajectory.terminated[2, 0])
    for t in range(7):
        if not trajectory.dones[t, 0]:
            assert next_obs[t, 0].tolist() == obs[t + 1, 0].tolist()
    assert next_obs[7, 0].tolist() == [0, 2, 2]  # the last step: the pending observation
    assert trajectory.terminated[1, 1]  # env 1 terminates
    assert (trajectory.actions.abs() <= 1).all()
    # through the replay buffer, by index: the same next observations
    replay = ReplayBuffer(16, 2, (3,), (1,))
    truncated = trajectory.dones & ~trajectory.terminated
    replay.add(
        trajectory.obs, trajectory.actions, trajectory.rewards, trajectory.terminated, truncated, trajectory.next_obs
    )
    rows = torch.arange(16)
    assert torch.equal(replay.gather(rows)[4], trajectory.next_obs.reshape(16, 3))
    # PPO's lanes are unchanged: no next_obs, and shards/concatenation carry the None
    ppo = RolloutWorker.from_config(
        load_config(None, ["env.num_envs=2"]), env.observation_space, gym.spaces.Discrete(2)
    )
    ppo.configure_lanes([2], 4, env.observation_space, gym.spaces.Discrete(2))
    assert ppo.lanes[0].next_obs is None
    assert trajectory.shard(1, 2).next_obs.shape == (8, 1, 3)


def test_the_env_receives_the_actors_actions_mapped_onto_its_box_once_in_training_and_evaluation():
    """SAC's actor acts in [-1, 1]^d; the env takes `action_bias + action_scale · a`, through the
    rollout worker's one seam (`env_actions`, the actor's `to_env`) on both paths: collecting (the
    lanes record a, the env receives the mapped action) and `fleetrl eval`'s play of the
    deterministic action (what a resumed or published checkpoint is judged by). A lopsided Box
    (tests/envs.py `ActionEcho`) tells a mapped action from one not mapped or mapped twice."""
    env = EnvWorker(EnvConfig(id="tests.envs:ActionEcho", num_envs=2, kwargs={"length": 3}), 0.99, seed=0)
    try:
        echoes = [sub.unwrapped for sub in env.stages[0].envs]
        torch.manual_seed(0)
        actor = SquashedGaussianActor(1, 2, [8], "relu", env.action_space.low, env.action_space.high)
        rollout = SACRolloutWorker(actor, torch.Generator().manual_seed(0))
        rollout.configure_lanes([2], 4, env.observation_space, env.action_space)
        collector = Collector(InlineGroup([], [env]), InlineGroup([], [rollout]), 1, 4)
        collector.start(0)
        recorded = collector.collect().actions  # (T, N, 2)
        assert (recorded.abs() <= 1).all()  # the actor's a, as the replay buffer keeps it
        received = torch.tensor(np.array([echo.received for echo in echoes])).transpose(0, 1)
        assert torch.allclose(received, torch.tensor([0.0, 2.0]) + 2 * recorded)
        for echo in echoes:
            echo.received.clear()
        played = play(env, rollout, episodes=2, deterministic=True, film=False)
    finally:
        env.close()
    assert played.lengths == [3, 3]
    mode = actor.to_env(actor.act(torch.tensor([[0.0], [1 / 3], [2 / 3]]), deterministic=True))
    for echo in echoes:
        assert torch.allclose(torch.tensor(np.array(echo.received)), mode)


# --------------------------------------------------------------------------------- config

BAD_SAC_CONFIGS = {
    "buffer below an iteration": (["algorithm.buffer_size=8"], "algorithm.buffer_size"),
    "zero update-to-data": (["algorithm.update_to_data=0"], "algorithm.update_to_data"),
    "tau above 1": (["algorithm.tau=1.5"], "algorithm.tau"),
    "policy frequency 0": (["algorithm.policy_frequency=0"], "algorithm.policy_frequency"),
    "negative learning starts": (["algorithm.learning_starts=-1"], "algorithm.learning_starts"),
    "normalised observations": (["env.normalize_obs=true"], "env.normalize_obs"),
    "fsdp": (["actor.strategy=fsdp"], "actor.strategy"),
    "custom model": (["model={id: tests.envs:CountingEnv}"], "model.id"),  # the whole section: no MLP keys
    "accumulation": (["actor.micro_batch_size=8"], "actor.micro_batch_size"),
}


@pytest.mark.parametrize("overrides, key", BAD_SAC_CONFIGS.values(), ids=BAD_SAC_CONFIGS.keys())
def test_invalid_sac_config_is_a_config_error(overrides, key):
    with pytest.raises(ConfigError) as caught:
        load_config(REPO / "configs/sac_pendulum.yaml", overrides)
    assert caught.value.key == key


def test_sac_needs_a_box_action_space():
    config = load_config(REPO / "configs/sac_pendulum.yaml", ["env.id=CartPole-v1"])
    with pytest.raises(ConfigError) as caught:
        check_spaces(config, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    assert caught.value.key == "algorithm.name" and "CartPole-v1" in str(caught.value)
    # a minibatch that does not divide num_steps * num_envs is fine for SAC (it samples a replay)
    assert load_config(REPO / "configs/sac_pendulum.yaml").algorithm.minibatch_size == 256
    with pytest.raises(ConfigError) as caught:  # a SAC-only key elsewhere
        load_config(REPO / "configs/ppo_cartpole.yaml", ["algorithm.matmul_dtype=bfloat16"])
    assert caught.value.key == "algorithm.matmul_dtype"


# ----------------------------------------------------------------------- 2 DDP ranks vs 1

WORLD = 2
NAMES = list(sac_support.SCENARIOS)


@pytest.fixture(scope="module")
def ddp_runs():
    return spawn_ranks(each_scenario, sac_support.train_rank, NAMES, world=WORLD, timeout_s=240)


@pytest.mark.parametrize("name", NAMES)
def test_two_ddp_ranks_update_exactly_as_one_process_on_the_same_data(ddp_runs, name):
    reference = sac_support.train_reference(name)
    rank0, rank1 = ddp_runs[0][name], ddp_runs[1][name]
    assert rank0["ddp_wrapped"] == "DistributedDataParallel" and rank0["ddp_buffers"] == 0
    # actor, critics, targets, alpha and both Adam states: the single-process result
    assert max_difference(rank0["state"], reference) <= 1e-5
    # and the replicas are bitwise equal, targets included (fingerprints of the exact bits)
    assert rank0["replicas_after_updates"] == {} and rank1["replicas_after_updates"] == {}
    assert max_difference(rank0["state"], rank1["state"]) == 0


@pytest.mark.parametrize("name", NAMES)
def test_two_ddp_ranks_train_from_their_own_replay_shards_in_lock_step(ddp_runs, name):
    rank0, rank1 = ddp_runs[0][name], ddp_runs[1][name]
    assert rank0["metrics"] == rank1["metrics"]  # reduced over ranks: identical
    assert rank0["replicas_after_train"] == {} == rank1["replicas_after_train"]
    steps = sac_support.STEPS * sac_support.ENVS
    utd = sac_support.config_for(name).algorithm.update_to_data
    assert [m["grad_steps"] for m in rank0["metrics"]] == [int(steps * utd)] * 3
    assert rank0["metrics"][-1]["replay_size"] == 3 * steps
    assert rank0["replay_size"] == rank1["replay_size"] == 3 * steps // WORLD  # each its own shard
    # the checkpoint: rank 0 gathered both shards; they differ (each rank's own env columns)
    shards = rank0["checkpoint"]["shards"]
    assert len(shards) == 2 and rank1["checkpoint"]["shards"] is None
    assert not torch.equal(shards[0]["replay"]["obs"], shards[1]["replay"]["obs"])
    # which a single-rank run cannot load as its own: it warns and starts with an empty buffer
    single = SACActorWorker(sac_support.config_for(name), *sac_support.spaces())
    single.load_state_dict(rank0["checkpoint"])
    assert len(single.replay) == 0 and single.env_steps == 3 * steps
    # a 2-rank run takes its shard back
    again = SACActorWorker(sac_support.config_for(name), *sac_support.spaces(), rank=1, world_size=2)
    again.load_state_dict(rank0["checkpoint"])
    assert len(again.replay) == rank1["replay_size"]
    assert torch.equal(again.replay.state_dict()["obs"], shards[1]["replay"]["obs"])


# ----------------------------------------------------------------------------- end to end

SMALL = [
    "model.hidden_sizes=[64, 64]",
    "runner.target_return=null",
    "runner.tensorboard=false",
    "runner.checkpoint_interval=25",
]


@pytest.mark.parametrize("with_replay", [True, False], ids=["with replay", "without replay"])
def test_train_then_resume_pendulum(tmp_path, with_replay):
    flag = f"algorithm.checkpoint_replay_buffer={str(with_replay).lower()}"
    runs = tmp_path / "runs"
    run = train("configs/sac_pendulum.yaml", *SMALL, flag, "runner.total_env_steps=1600", runs=runs).succeeded()
    run_dir, first = run.run_dir, run.metrics
    assert first[-1]["global_step"] == 1600 and first[-1]["replay_size"] == 1600
    assert first[0]["random_actions"] and not first[-1]["random_actions"]
    assert [m["grad_steps"] for m in first[:12]] == [0] * 12 and first[12]["grad_steps"] == 8
    assert all(math.isfinite(m["q_loss"]) for m in first[12:])
    second = fleetrl(
        "train",
        "configs/sac_pendulum.yaml",
        *SMALL,
        flag,
        "runner.total_env_steps=2000",
        f"runner.resume={run_dir}",
        runs=runs,
    ).succeeded()
    resumed, summary = second.metrics[len(first) :], second.summary
    assert summary["global_step"] == 2000 and resumed[0]["global_step"] == 1608
    assert not resumed[0]["random_actions"]  # warm-up is over, whatever the buffer
    if with_replay:  # the same data: training goes straight on
        assert resumed[0]["replay_size"] == 1608 and resumed[0]["grad_steps"] == 8
    else:  # refilled from empty: training waits for learning_starts (100) transitions again
        assert resumed[0]["replay_size"] == 8 and resumed[0]["grad_steps"] == 0
        assert resumed[12]["replay_size"] == 104 and resumed[12]["grad_steps"] == 8
    if with_replay:
        result = fleetrl("eval", str(run_dir), "--episodes", "2", "--json")
        assert result.code == 0, result.stderr[-4000:]
        evaluation = json.loads(result.stdout.strip().splitlines()[-1])
        assert evaluation["episodes"] == 2 and -2000 < evaluation["mean"] <= 0


def test_sac_on_discrete_actions_stops_with_a_config_error(tmp_path):
    result = train("configs/sac_pendulum.yaml", "env.id=CartPole-v1", "--skip-doctor", runs=tmp_path, timeout=120)
    assert result.code == 2, result.stderr[-3000:]
    assert "algorithm.name" in result.stderr and "CartPole-v1" in result.stderr
    assert "Traceback" not in result.stderr
