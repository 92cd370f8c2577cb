"""EnvWorker's auto-reset bookkeeping and the Collector's bootstrap values, on `tests.envs.CountingEnv`
(whose episodes are written down in advance; see its docstring)."""

from __future__ import annotations

import threading

import numpy as np
import psutil
import pytest
import torch

from fleetrl.cluster.exchange.collect import Collector
from fleetrl.cluster.groups import InlineGroup
from fleetrl.config.model_sections import MlpModelConfig
from fleetrl.config.schema import EnvConfig
from fleetrl.models.policy import Policy
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.envs import obs
from tests.support import own_children

ENTRY = "tests.envs:CountingEnv"


def make_worker(
    lengths=(3,), terminal=(True,), num_envs=2, max_episode_steps=None, seed=0, training=True, **env_options
) -> EnvWorker:
    config = EnvConfig(
        id=ENTRY,
        kwargs={"lengths": list(lengths), "terminal": list(terminal)},
        num_envs=num_envs,
        max_episode_steps=max_episode_steps,
        **env_options,
    )
    return EnvWorker(config, gamma=0.99, seed=seed, training=training)


@pytest.fixture
def worker_factory():
    workers = []

    def factory(**kwargs):
        workers.append(make_worker(**kwargs))
        return workers[-1]

    yield factory
    for worker in workers:
        worker.close()


def step(worker: EnvWorker, num_envs: int = 2):
    return worker.step(np.zeros(num_envs, np.int64))


def test_terminated_episode_resets_in_the_same_step(worker_factory):
    worker = worker_factory(lengths=[3, 5])  # env 0: 3 steps, env 1: 5 steps, both terminate
    np.testing.assert_array_equal(worker.reset(), [obs(0, 0, 0), obs(1, 0, 0)])
    step(worker)
    result = step(worker)
    np.testing.assert_array_equal(result.obs, [obs(0, 0, 2), obs(1, 0, 2)])
    np.testing.assert_array_equal(result.reward, [2, 2])
    result = step(worker)  # env 0 ends its first episode
    np.testing.assert_array_equal(result.obs, [obs(0, 1, 0), obs(1, 0, 3)])
    np.testing.assert_array_equal(result.reward, [3, 3])
    np.testing.assert_array_equal(result.terminated, [True, False])
    np.testing.assert_array_equal(result.truncated, [False, False])
    assert result.truncated_index.size == 0
    assert result.final_obs.shape == (0, 3)
    assert result.obs.dtype == np.float32 and result.reward.dtype == np.float32
    returns, lengths = worker.drain_episodes()
    assert (returns, lengths) == ([6.0], [3])
    assert worker.drain_episodes() == ([], [])

    step(worker)
    result = step(worker)  # env 1 ends (5 steps)
    np.testing.assert_array_equal(result.obs, [obs(0, 1, 2), obs(1, 1, 0)])
    np.testing.assert_array_equal(result.terminated, [False, True])
    result = step(worker)  # env 0 ends its second episode
    np.testing.assert_array_equal(result.obs, [obs(0, 2, 0), obs(1, 1, 1)])
    np.testing.assert_array_equal(result.terminated, [True, False])
    returns, lengths = worker.drain_episodes()
    assert returns == [15.0, 6.0] and lengths == [5, 3]
    assert worker.env_steps == 12
    assert worker.episodes == 3


def test_time_limit_is_reported_as_truncation_with_final_obs(worker_factory):
    # env 0 terminates every 2 steps; env 1 never terminates and is truncated every 3 steps
    worker = worker_factory(lengths=[2], terminal=[True, False], max_episode_steps=3)
    worker.reset()
    expected = [  # (obs after the step, terminated, truncated, final obs of the truncated envs)
        ([obs(0, 0, 1), obs(1, 0, 1)], [False, False], [False, False], []),
        ([obs(0, 1, 0), obs(1, 0, 2)], [True, False], [False, False], []),
        ([obs(0, 1, 1), obs(1, 1, 0)], [False, False], [False, True], [obs(1, 0, 3)]),
        ([obs(0, 2, 0), obs(1, 1, 1)], [True, False], [False, False], []),
        ([obs(0, 2, 1), obs(1, 1, 2)], [False, False], [False, False], []),
        ([obs(0, 3, 0), obs(1, 2, 0)], [True, False], [False, True], [obs(1, 1, 3)]),
    ]
    for number, (next_obs, terminated, truncated, final) in enumerate(expected, 1):
        result = step(worker)
        np.testing.assert_array_equal(result.obs, next_obs, err_msg=f"step {number}")
        np.testing.assert_array_equal(result.terminated, terminated, err_msg=f"step {number}")
        np.testing.assert_array_equal(result.truncated, truncated, err_msg=f"step {number}")
        np.testing.assert_array_equal(result.truncated_index, np.flatnonzero(truncated))
        assert result.final_obs.shape == (len(final), 3)
        np.testing.assert_array_equal(result.final_obs.reshape(-1, 3), np.reshape(final, (-1, 3)))
    returns, lengths = worker.drain_episodes()
    # in order of ending (ties by env index): env0@2, env1@3, env0@4, env0@6, env1@6
    assert returns == [3.0, 6.0, 3.0, 3.0, 6.0]
    assert lengths == [2, 3, 2, 2, 3]
    assert worker.episodes == 5
    assert worker.env_steps == 12


def test_termination_at_the_time_limit_is_a_termination(worker_factory):
    worker = worker_factory(lengths=[3], terminal=[True], max_episode_steps=3)
    worker.reset()
    step(worker)
    step(worker)
    result = step(worker)
    np.testing.assert_array_equal(result.terminated, [True, True])
    np.testing.assert_array_equal(result.truncated, [False, False])
    assert result.truncated_index.size == 0 and result.final_obs.shape == (0, 3)


def test_all_envs_truncated_at_once(worker_factory):
    worker = worker_factory(terminal=[False], num_envs=3, max_episode_steps=2)
    worker.reset()
    worker.step(np.zeros(3, np.int64))
    result = worker.step(np.zeros(3, np.int64))
    np.testing.assert_array_equal(result.truncated_index, [0, 1, 2])
    np.testing.assert_array_equal(result.final_obs, [obs(0, 0, 2), obs(1, 0, 2), obs(2, 0, 2)])
    np.testing.assert_array_equal(result.obs, [obs(0, 1, 0), obs(1, 1, 0), obs(2, 1, 0)])
    assert worker.drain_episodes() == ([3.0, 3.0, 3.0], [2, 2, 2])


def test_reset_seeds_each_env_and_shifts_per_epoch(worker_factory):
    worker = worker_factory(seed=10, num_envs=2)
    np.testing.assert_array_equal(worker.reset()[:, 0], [10, 11])
    np.testing.assert_array_equal(worker.reset(epoch=3)[:, 0], [16, 17])


def test_reset_discards_the_unfinished_episode(worker_factory):
    worker = worker_factory(lengths=[3])
    worker.reset()
    step(worker)
    step(worker)
    worker.reset()
    for _ in range(3):
        step(worker)
    assert worker.drain_episodes() == ([6.0, 6.0], [3, 3])


def test_episode_returns_are_raw_when_rewards_are_normalised(worker_factory):
    worker = worker_factory(lengths=[3], normalize_reward=True)
    worker.reset()
    rewards = [step(worker).reward for _ in range(3)]
    raw = np.array([[1, 1], [2, 2], [3, 3]], np.float32)
    assert not np.allclose(rewards, raw), "normalize_reward changed nothing"
    assert worker.drain_episodes() == ([6.0, 6.0], [3, 3])


def test_final_obs_is_normalised_with_the_current_statistics(worker_factory):
    worker = worker_factory(terminal=[False], max_episode_steps=2, normalize_obs=True)
    worker.reset()
    step(worker)
    count_before = worker.obs_norm.stats.count
    result = step(worker)
    stats = worker.obs_norm.stats
    assert stats.count == count_before + 2, "the final obs must not update the statistics"
    raw_final = np.array([obs(0, 0, 2), obs(1, 0, 2)])
    expected = np.clip((raw_final - stats.mean) / np.sqrt(stats.var + 1e-8), -10, 10)
    np.testing.assert_allclose(result.final_obs, expected, rtol=1e-5, atol=1e-6)
    assert result.final_obs.dtype == np.float32


def test_evaluation_worker_keeps_statistics_frozen(worker_factory):
    worker = worker_factory(normalize_obs=True, normalize_reward=True, training=False)
    worker.reset()
    for _ in range(4):
        step(worker)
    assert worker.obs_norm.stats.count == pytest.approx(1e-4)
    assert worker.reward_norm.stats.count == pytest.approx(1e-4)


def test_state_dict_round_trip(worker_factory):
    worker = worker_factory(normalize_obs=True, normalize_reward=True)
    worker.reset()
    for _ in range(5):
        step(worker)
    state = worker.state_dict()
    other = worker_factory(normalize_obs=True, normalize_reward=True)
    other.load_state_dict(state)
    assert (other.env_steps, other.episodes) == (10, 2)
    np.testing.assert_array_equal(other.obs_norm.stats.mean, worker.obs_norm.stats.mean)
    np.testing.assert_array_equal(other.obs_norm.stats.var, worker.obs_norm.stats.var)
    assert other.reward_norm.stats.count == worker.reward_norm.stats.count


def test_async_vectorization_matches_sync(worker_factory):
    kwargs = dict(lengths=[2], terminal=[True, False], max_episode_steps=3)
    sync = worker_factory(**kwargs)
    parallel = worker_factory(vectorization="async", **kwargs)
    np.testing.assert_array_equal(sync.reset(), parallel.reset())
    for _ in range(7):
        a, b = step(sync), step(parallel)
        for name in ("obs", "reward", "terminated", "truncated", "truncated_index", "final_obs"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert sync.drain_episodes() == parallel.drain_episodes()
    assert (sync.env_steps, sync.episodes) == (parallel.env_steps, parallel.episodes)


def test_async_env_processes_are_spawned_not_forked(worker_factory):
    """DESIGN: 'processes are spawned, never forked after torch has started threads'. A forked
    child runs the parent's command line; a spawned one runs multiprocessing's spawn_main."""
    torch.ones(64, 64) @ torch.ones(64, 64)  # torch is up in this process
    worker = worker_factory(vectorization="async")
    worker.reset()
    children = own_children()
    assert len(children) == 2
    for child in children:
        assert "spawn_main" in " ".join(child.cmdline()), f"env subprocess {child.pid} was forked: {child.cmdline()}"


def test_close_ends_async_env_processes():
    worker = make_worker(vectorization="async")
    worker.reset()
    children = own_children()
    assert len(children) == 2
    worker.close()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []


def test_close_ends_async_env_processes_when_a_stop_interrupted_a_step():
    """SIGINT to the controller alone raises in its main thread wherever it is — often inside an
    async step, after some subprocesses' answers were read: the rest never come (seen on a GPU
    machine: Ctrl-C by pid hung 30 s in env.close, then a hang report)."""
    worker = make_worker(vectorization="async")
    worker.reset()
    (vector,) = worker.stages
    children = own_children()
    vector.step_async(np.zeros(2, np.int64))
    vector.parent_pipes[0].recv()  # env 0's answer read, then the stop: env 1's never is
    closing = threading.Thread(target=worker.close, daemon=True)
    closing.start()
    closing.join(timeout=60)  # the close waits ASYNC_CLOSE_TIMEOUT_S (5 s) at most, then terminates
    assert not closing.is_alive(), "close is still waiting for the interrupted step"
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []


# --- Collector ---------------------------------------------------------------------------------


def check_trajectory(trajectory, policy: Policy, obs_after: np.ndarray, max_steps: int) -> int:
    """Checks the bootstrap values of one collected trajectory; returns how many truncations."""
    steps, num_envs = trajectory.rewards.shape
    obs_t = trajectory.obs
    with torch.no_grad():
        torch.testing.assert_close(trajectory.values, policy.value(obs_t.flatten(0, 1)).view(steps, num_envs))
        truncated = trajectory.dones & ~trajectory.terminated
        for t in range(steps):
            for i in range(num_envs):
                if truncated[t, i]:
                    final = obs_t[t, i].clone()
                    final[2] += 1  # the final obs is one step past the obs the action saw
                    assert final[2] == max_steps
                    expected = policy.value(final[None])[0]
                    reset_value = trajectory.values[t + 1, i] if t + 1 < steps else None
                    if reset_value is not None:
                        assert not torch.isclose(expected, reset_value), "test cannot tell them apart"
                elif t + 1 < steps:
                    expected = trajectory.values[t + 1, i]
                else:
                    expected = policy.value(torch.from_numpy(obs_after[i : i + 1]))[0]
                if not trajectory.terminated[t, i]:
                    torch.testing.assert_close(trajectory.next_values[t, i], expected, msg=f"next_values[{t}, {i}]")
    return int(truncated.sum())


def inline_collector(env: EnvWorker, policy: Policy, steps: int, stages: int = 1) -> Collector:
    """A Collector over one env worker and one rollout worker in this process (the inline backend)."""
    rollout = RolloutWorker(policy)
    lane = env.num_envs // stages
    rollout.configure_lanes([lane] * stages, steps, env.observation_space, env.action_space)
    return Collector(InlineGroup([], [env]), InlineGroup([], [rollout]), stages=stages, steps=steps)


def truncating_env(stages: int = 1) -> EnvWorker:
    """env 0 terminates every 2 steps; env 1 never terminates and is truncated every 3 steps."""
    config = EnvConfig(id=ENTRY, kwargs={"lengths": [2], "terminal": [True, False]}, num_envs=2, max_episode_steps=3)
    return EnvWorker(config, gamma=0.99, seed=0, stages=stages)


def test_collector_bootstraps_truncations_from_the_final_obs():
    env = truncating_env()
    try:
        torch.manual_seed(0)
        policy = Policy.from_config(MlpModelConfig(), env.observation_space, env.action_space)
        collector = inline_collector(env, policy, steps=7)
        collector.start(0)
        trajectory = collector.collect()
        # env 0 terminates at steps 2, 4, 6; env 1 is truncated at steps 3 and 6 (t = step - 1)
        expected_terminated = torch.zeros(7, 2, dtype=torch.bool)
        expected_terminated[[1, 3, 5], 0] = True
        expected_dones = expected_terminated.clone()
        expected_dones[[2, 5], 1] = True
        assert torch.equal(trajectory.terminated, expected_terminated)
        assert torch.equal(trajectory.dones, expected_dones)
        np.testing.assert_array_equal(
            trajectory.obs[:3].numpy(),
            [[obs(0, 0, 0), obs(1, 0, 0)], [obs(0, 0, 1), obs(1, 0, 1)], [obs(0, 1, 0), obs(1, 0, 2)]],
        )
        np.testing.assert_array_equal(trajectory.rewards[:, 1].numpy(), [1, 2, 3, 1, 2, 3, 1])
        # the two truncations, spelled out: V(final obs), not V(the reset obs that followed)
        with torch.no_grad():
            v_final = policy.value(torch.tensor([obs(1, 0, 3), obs(1, 1, 3)]))
        torch.testing.assert_close(trajectory.next_values[[2, 5], 1], v_final)
        after = np.array([obs(0, 3, 1), obs(1, 2, 1)], np.float32)  # the obs after 7 steps
        assert check_trajectory(trajectory, policy, after, max_steps=3) == 2

        # the next collect continues the same episodes and does not reuse old bootstrap values
        trajectory = collector.collect()
        np.testing.assert_array_equal(trajectory.obs[0].numpy(), after)
        assert trajectory.dones[:, 1].nonzero().flatten().tolist() == [1, 4]
        after = np.array([obs(0, 7, 0), obs(1, 4, 2)], np.float32)  # after 14 steps
        assert check_trajectory(trajectory, policy, after, max_steps=3) == 2
        assert env.env_steps == 28
    finally:
        env.close()


def test_pipelined_stages_collect_the_same_trajectory():
    """Two pipeline stages of one env each give the same (T, N) data as one stage of two envs
    (CountingEnv ignores actions, so only the bookkeeping can differ)."""
    trajectories = []
    for stages in (1, 2):
        env = truncating_env(stages)
        try:
            torch.manual_seed(0)
            policy = Policy.from_config(MlpModelConfig(), env.observation_space, env.action_space)
            collector = inline_collector(env, policy, steps=7, stages=stages)
            collector.start(0)
            collector.collect()
            trajectories.append(collector.collect())
            assert env.env_steps == 28
            returns, lengths = env.drain_episodes()  # 14 steps: env 0 ends 7 times, env 1 4 times
            assert sorted(returns) == [3.0] * 7 + [6.0] * 4
            assert sorted(lengths) == [2] * 7 + [3] * 4
        finally:
            env.close()
    one, two = trajectories
    for name in ("obs", "rewards", "terminated", "dones", "values", "next_values"):
        torch.testing.assert_close(getattr(two, name), getattr(one, name), msg=name)


def test_truncation_on_the_last_step_of_a_rollout_bootstraps_from_the_final_obs():
    env = truncating_env()
    try:
        torch.manual_seed(0)
        policy = Policy.from_config(MlpModelConfig(), env.observation_space, env.action_space)
        collector = inline_collector(env, policy, steps=3)  # env 1 is truncated at t = 2 = T - 1
        collector.start(0)
        trajectory = collector.collect()
        with torch.no_grad():
            v_final, v_reset = policy.value(torch.tensor([obs(1, 0, 3), obs(1, 1, 0)]))
        assert not torch.isclose(v_final, v_reset)
        torch.testing.assert_close(trajectory.next_values[2, 1], v_final)
        torch.testing.assert_close(trajectory.next_values[2, 0], policy.value(torch.tensor([obs(0, 1, 1)]))[0])
    finally:
        env.close()
