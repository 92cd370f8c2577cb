"""GRPO on the robot task set (issue 24, must-have 3), on the real simulator: a group is the episodes
of one task from one reset seed (RLinf's GRPO groups on LIBERO), and action chunks whose
episode ends inside them — by a success and by the time limit — get group-relative advantages
computed by hand.

Two groups of two envs (`algorithm.group_size: 2`), chunks of 4 actions on 10-step episodes, three
decisions, γ = 0.5. The scripted expert's action (computed at a chunk's start, repeated over it)
reaches the target within a few steps; zero actions never do (that episode is truncated after
4 + 4 + 2 steps)."""

from __future__ import annotations

import numpy as np
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.algos.ppo.grpo import grpo_advantages
from fleetrl.envs.experts import expert_action
from fleetrl.plan.layout import env_worker_args
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.trajectory import TrajectoryBuffer
from fleetrl.workers.env_worker import EnvWorker

SEED = 23  # both groups (reset seeds 23 and 24) draw reach: the expert succeeds within the episode
CHUNK = 4
GAMMA = 0.5
GRPO = [
    "env.kwargs={tasks: [reach, push], image_size: 32, max_steps: 10, sim_state: true}",
    "env.num_envs=4",
    "env.vectorization=sync",  # the env worker's own simulators, which the test reads
    "algorithm.num_steps=3",
    "algorithm.minibatch_size=12",
    "algorithm.adv_type=grpo",
    "algorithm.norm_adv=false",
    "algorithm.group_size=2",
    f"algorithm.gamma={GAMMA}",
    f"model.action_chunk={CHUNK}",
    f"runner.seed={SEED}",
]


def equal_obs(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[key], b[key]) for key in a)


def row(obs: dict, env: int) -> dict:
    return {key: value[env] for key, value in obs.items()}


def test_grpo_groups_are_one_task_from_one_reset_seed_and_chunks_end_inside_episodes():
    config = load_config("configs/ppo_manipulation.yaml", GRPO)
    worker = EnvWorker(*env_worker_args(config, resolve(config).placement, 0))
    try:
        obs = worker.reset()
        pandas = [env.unwrapped for env in worker.stages[0].envs]
        assert [panda.task_name for panda in pandas] == ["reach"] * 4
        # a group's members start from one state; the two groups from two
        assert equal_obs(row(obs, 0), row(obs, 1)) and equal_obs(row(obs, 2), row(obs, 3))
        assert not np.array_equal(obs["image"][0], obs["image"][2])
        idle = np.zeros(4, np.float32)
        buffer = TrajectoryBuffer(3, 4, worker.observation_space, (CHUNK, 4), np.float32, (CHUNK,), record_steps=True)
        starts: dict[int, list[dict]] = {env: [] for env in range(4)}  # each env's episodes after its first
        for t in range(3):
            expert = [expert_action(panda) for panda in pandas]
            # env 0 and env 2: the expert; env 1: idle; env 3: idle for 2 steps, then the expert
            plans = [[expert[0]] * 4, [idle] * 4, [expert[2]] * 4, [idle, idle, expert[3], expert[3]]]
            actions = np.stack(
                [np.stack(plan) for plan in plans[:3]] + [np.stack(plans[3] if t == 0 else [expert[3]] * 4)]
            )
            buffer.record_policy(t, obs, actions, np.zeros((4, CHUNK), np.float32), np.zeros(4, np.float32))
            step = worker.step(actions)
            buffer.record_outcome(t, step, np.zeros(len(step.truncated_index), np.float32))
            for env in np.flatnonzero(step.terminated | step.truncated):
                starts[int(env)].append(row(step.obs, int(env)))
            obs = step.obs
        trajectory = buffer.finish(np.zeros(4, np.float32))
    finally:
        worker.close()

    # What happened, decision by decision (env steps each ran, raw and in-chunk-discounted rewards):
    # env 0 reaches the target (on the table, 13 cm or more below the gripper's start: 3 steps of
    # at most 5 cm at least) at step 3 of its chunks in two episodes, at step 4 in the third; env 1
    # idles until the time limit cuts its third chunk after 2 steps; env 2 succeeds at step 3,
    # env 3 — 2 steps behind — at step 2 of its second chunk.
    assert trajectory.steps.tolist() == [[3, 4, 3, 4], [3, 4, 4, 2], [4, 2, 4, 4]]
    assert trajectory.chunk_returns.tolist() == [[1, 0, 1, 0], [1, 0, 0, 1], [1, 0, 0, 0]]
    # γ^j for a success at step j + 1 of its chunk: env 0 j = 2, 2, 3; env 2 j = 2; env 3 j = 1
    assert trajectory.rewards.tolist() == [[0.25, 0, 0.25, 0], [0.25, 0, 0, 0.5], [0.125, 0, 0, 0]]
    assert trajectory.terminated.tolist() == [
        [True, False, True, False],
        [True, False, False, True],
        [True] + [False] * 3,
    ]
    assert trajectory.dones.tolist() == [
        [True, False, True, False],
        [True, False, False, True],
        [True, True, False, False],
    ]
    # Episode 1 of a group's members: again one task from one reset seed, though each member's
    # episode 0 ended at another step.
    assert equal_obs(starts[0][0], starts[1][0]) and equal_obs(starts[2][0], starts[3][0])

    advantages, _ = ActorWorker(config, worker.observation_space, worker.action_space).advantages(trajectory)
    # Group 0, episode 0: returns 1 (env 0) and 0 (env 1): mean 0.5, unbiased std √0.5, so
    # ±0.5 / (√0.5 + 1e-6) on every step of each episode (env 1's spans all three decisions).
    # Env 0's episodes 1 and 2 have no complete counterpart in env 1: 0. Group 1, episode 0: two
    # successes, returns 1 and 1: 0 — where in its chunk each fell does not count; both
    # episodes 1 are unfinished: 0.
    a = 0.5 / (0.5**0.5 + 1e-6)
    expected = torch.tensor([[a, -a, 0, 0], [0, -a, 0, 0], [0, -a, 0, 0]])
    torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=0)
    # The in-chunk-discounted rewards would tell group 1's two successes apart (0.25 against 0 + 0.5):
    discounted = grpo_advantages(trajectory.rewards, trajectory.dones, 2)
    b = 0.125 / (0.125 * 2**0.5 + 1e-6)  # returns 0.25 and 0.5: deviations ±0.125, unbiased std 0.125·√2
    torch.testing.assert_close(discounted[:2, 2:], torch.tensor([[-b, b], [0, b]]), rtol=1e-6, atol=0)
