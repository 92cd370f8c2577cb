"""The env component: a vector of simulators, episode bookkeeping and optional normalisation.

`step` returns everything the learner needs to treat the two ways an episode ends differently:
`terminated` (a true end: no bootstrap) and `truncated` (a time limit: bootstrap from the final
observation, returned as `final_obs` for exactly those envs).

With `chunk` K > 1 (`model.action_chunk`) `step` takes (N, K, ...) actions and each env executes
its chunk as up to K env steps, stopping at its episode's end (`fleetrl.envs.make.ActionChunk`):
the result is one decision per env — reward Σ_j γ^j r_j over the k executed steps, `steps` = k,
`chunk_return` Σ_j r_j — and the counters (env steps, episode lengths and returns) count the executed env steps.
"""

from __future__ import annotations

import contextlib

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from fleetrl.config.schema import EnvConfig
from fleetrl.envs.contract import SyncContract
from fleetrl.envs.make import make_vector_env, step_action_space
from fleetrl.envs.normalize import RewardNormalizer, observation_normalizer
from fleetrl.non_finite import all_finite
from fleetrl.observations import map_obs, obs_len, stack_obs
from fleetrl.probe.flight_recorder import phase
from fleetrl.step_result import StepResult
from fleetrl.workers.nan_policy import NanPolicy, StepPlace, values_finite

ALL_TASKS = "all"  # the task name of episodes whose env names none


def success_metrics(successes: list[tuple[str, bool]], prefix: str = "") -> dict:
    """`<prefix>success_rate` over all `(task, success)` episodes and, for a multi-task env,
    `<prefix>success_rate/<task>` per task and `<prefix>success_rate_task_mean`, the mean of the
    tasks' rates (Meta-World's multi-task figure: each task weighs the same, however many of its
    episodes ended), for a metrics record; {} when there are none."""
    if not successes:
        return {}
    record = {f"{prefix}success_rate": float(np.mean([flag for _, flag in successes]))}
    tasks = sorted({task for task, _ in successes} - {ALL_TASKS})
    for task in tasks:
        record[f"{prefix}success_rate/{task}"] = float(np.mean([flag for name, flag in successes if name == task]))
    if tasks:
        record[f"{prefix}success_rate_task_mean"] = float(np.mean([record[f"{prefix}success_rate/{t}"] for t in tasks]))
    return record


ASYNC_CLOSE_TIMEOUT_S = 5.0  # an async vector env's subprocesses get this long to answer a pending call at close


class EnvWorker:
    """`num_envs` simulators, split into `stages` equal vector envs that are stepped separately
    (pipelining: while one stage steps, the policy infers the next). Normalisation statistics
    and episode bookkeeping are shared by the stages. A stage holds whole groups of
    `reset_group_size` envs (the run plan checks it: plan/layout.py `check_data_layout`)."""

    def __init__(
        self,
        config: EnvConfig,
        gamma: float,
        seed: int,
        num_envs: int | None = None,
        training: bool = True,
        stages: int = 1,
        reset_group_size: int = 1,
        chunk: int = 1,
    ):
        count = config.num_envs if num_envs is None else num_envs
        self.reset_group_size = reset_group_size
        self.chunk = chunk
        self.stages = [
            make_vector_env(config, count // stages, chunk, gamma, stage * (count // stages)) for stage in range(stages)
        ]
        self.num_envs, self.stage_size = count, count // stages
        self.nan_policy = NanPolicy(config.nan_policy, self.stage_size)
        self.contracts = [  # a sync vector's simulators held to their spaces here (envs/contract.py)
            SyncContract(vector, stage * self.stage_size) if isinstance(vector, SyncVectorEnv) else None
            for stage, vector in enumerate(self.stages)
        ]
        self.seed, self.training = seed, training
        self.observation_space = self.stages[0].single_observation_space
        self.action_space = step_action_space(self.stages[0].single_action_space, chunk)  # of one env step
        self.obs_norm = (
            observation_normalizer(self.observation_space, config.clip_obs) if config.normalize_obs else None
        )
        self.reward_norm = RewardNormalizer(count, gamma, config.clip_reward) if config.normalize_reward else None
        self.episode_return = np.zeros(count, np.float64)
        self.episode_length = np.zeros(count, np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.finished_games: list[tuple[int, float]] = []  # (env, raw score) of whole games (`env.wrappers: atari`)
        self.finished_successes: list[tuple[int, str, bool]] = []  # (env, task, success) where the env says
        self.env_steps = 0
        self.episodes = 0
        if isinstance(self.action_space, gym.spaces.Box):
            self.low, self.high = self.action_space.low, self.action_space.high

    def reset(self, epoch: int = 0) -> np.ndarray:
        """Reset all envs (stages concatenated in order); env i gets seed + i, shifted per epoch
        on resume so a resumed run does not replay the episodes it started with. With
        `reset_group_size` g > 1 envs i..i+g-1 of a group share the seed seed + i // g:
        each group starts from one state."""
        base = self.seed + epoch * self.num_envs
        group = self.reset_group_size
        self.episode_return[:] = 0
        self.episode_length[:] = 0
        obs = []
        for stage, vector in enumerate(self.stages):
            first = stage * self.stage_size
            seeds = base + first if group == 1 else [base + (first + i) // group for i in range(self.stage_size)]
            stage_obs = self.answer(stage, "reset", vector.reset, seed=seeds)[0]
            if self.contracts[stage] is not None:
                self.contracts[stage].check(vector, range(self.stage_size), "reset")
            place = StepPlace(self.episode_length, self.env_steps)
            obs.append(self.nan_policy.reset(vector, stage_obs, stage, place))
        return self._observe(map_obs(lambda *stages: np.concatenate(stages), *obs))

    def answer(self, stage: int, call: str, method, *args, **kwargs):
        """`method(*args, **kwargs)` of stage `stage`'s vector env; a failure the simulators' bad
        data caused (the batcher's) raised as the `BadSimulatorData` naming it."""
        try:
            return method(*args, **kwargs)
        except Exception as error:
            if self.contracts[stage] is not None:
                self.contracts[stage].diagnose(self.stages[stage], error, call)
            raise

    def step(self, actions: np.ndarray, stage: int = 0) -> StepResult:
        if isinstance(self.action_space, gym.spaces.Box):
            actions = np.clip(actions, self.low, self.high)
        vector = self.stages[stage]
        with phase("env.execute_chunk") if self.chunk > 1 else contextlib.nullcontext():  # K steps: a phase of its own
            obs, reward, terminated, truncated, info = self.answer(stage, "step", vector.step, actions)
        truncated = truncated & ~terminated
        if self.contracts[stage] is not None and "_final_obs" in info:  # episodes ended: what their simulators said
            self.contracts[stage].check(vector, info["_final_obs"].nonzero()[0], "step", info["final_obs"])
        envs = slice(stage * self.stage_size, (stage + 1) * self.stage_size)
        truncated_index = np.flatnonzero(truncated)
        final_obs, skipped = final_observations(info, truncated_index, obs), None
        if not values_finite(reward, obs, final_obs):  # before anything counts or normalises them
            place = StepPlace(self.episode_length, self.env_steps)
            checked = self.nan_policy.step(vector, stage, obs, reward, terminated, truncated, final_obs, place)
            obs, reward, terminated, truncated = checked.obs, checked.reward, checked.terminated, checked.truncated
            final_obs, skipped, truncated_index = checked.final_obs, checked.skipped, np.flatnonzero(checked.truncated)
        done = terminated | truncated
        steps = chunk_return = None
        if self.chunk > 1:
            ended = info.get("_final_obs", np.zeros(len(done), bool))  # as the simulators say: their final infos
            steps = chunk_info(info, ended, "chunk_steps").astype(np.int64)
            chunk_return = chunk_info(info, ended, "chunk_return")
            if not all_finite(chunk_return):  # a reward env.nan_policy replaced: the same in the chunk's return
                chunk_return = np.where(np.isfinite(chunk_return), chunk_return, 0.0)
            self._count(envs, chunk_return, done, steps, skipped)
            chunk_return = chunk_return.astype(np.float32)
        else:
            self._count(envs, reward, done, skipped=skipped)
        self._count_games(envs, info.get("final_info", {}))
        self._count_successes(envs, info.get("final_info", {}))
        if self.reward_norm is not None:
            reward = self.reward_norm(envs, reward, done, self.training)
        return StepResult(
            self._observe(obs),
            reward.astype(np.float32),
            terminated,
            truncated,
            truncated_index,
            self._observe(final_obs, update=False),
            steps,
            chunk_return,
        )

    def _observe(self, obs, update: bool = True):
        """Normalised (env.normalize_obs), float leaves as float32, the others (images, token
        ids) in their own dtype (`fleetrl.observations`)."""
        if self.obs_norm is not None and obs_len(obs):
            obs = self.obs_norm(obs, update and self.training)
        return map_obs(lambda x: x.astype(np.float32, copy=False) if x.dtype.kind == "f" else x, obs)

    def _count(
        self,
        envs: slice,
        reward: np.ndarray,
        done: np.ndarray,
        steps: np.ndarray | None = None,
        skipped: np.ndarray | None = None,
    ) -> None:
        """Episode returns and lengths, env steps and episodes; `steps`: env steps executed per
        env (a chunk's; one each without chunks); `skipped`: envs whose episode env.nan_policy
        skipped (it counts in no return and no episode)."""
        episode_return, episode_length = self.episode_return[envs], self.episode_length[envs]
        episode_return += reward
        episode_length += 1 if steps is None else steps
        self.env_steps += len(reward) if steps is None else int(steps.sum())
        if skipped is not None:
            episode_return[skipped] = 0
            episode_length[skipped] = 0
            done = done & ~skipped
        if done.any():
            self.finished_returns.extend(episode_return[done].tolist())
            self.finished_lengths.extend(episode_length[done].tolist())
            self.episodes += int(done.sum())
            episode_return[done] = 0
            episode_length[done] = 0

    def _count_games(self, envs: slice, final_info: dict) -> None:
        """The whole games that ended in this step (env index, raw score): in the final infos of
        the envs that ended an episode, where `fleetrl.envs.atari.GameScore` puts them."""
        if "game_return" in final_info:
            ended = np.flatnonzero(final_info["_game_return"])
            scores = final_info["game_return"][ended].tolist()
            self.finished_games.extend(zip((envs.start + ended).tolist(), scores))

    def _count_successes(self, envs: slice, final_info: dict) -> None:
        """(env index, task, success) of the episodes that ended in this step, where the env puts
        `success` (and, for a multi-task env, `task`: its name) in its info (`envs.manipulation`)."""
        if "success" in final_info:
            ended = np.flatnonzero(final_info["_success"])
            tasks = final_info["task"][ended] if "task" in final_info else [ALL_TASKS] * len(ended)
            flags = final_info["success"][ended]
            self.finished_successes.extend(
                (envs.start + int(i), str(task), bool(flag)) for i, task, flag in zip(ended, tasks, flags)
            )

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.observation_space, self.action_space

    def report(self) -> dict:
        """Counters and the episodes (and whole games) finished since the last report (drained)."""
        returns, lengths = self.drain_episodes()
        games = [score for _, score in self.drain_games()]
        successes = [(task, success) for _, task, success in self.drain_successes()]
        return {
            "successes": successes,
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "returns": returns,
            "lengths": lengths,
            "game_returns": games,
            "non_finite_replaced": self.nan_policy.replaced,
            "non_finite_skipped": self.nan_policy.skipped,
        }

    def drain_episodes(self) -> tuple[list[float], list[int]]:
        """Returns and lengths (raw, unnormalised) of the episodes finished since the last call."""
        returns, lengths = self.finished_returns, self.finished_lengths
        self.finished_returns, self.finished_lengths = [], []
        return returns, lengths

    def drain_games(self) -> list[tuple[int, float]]:
        """(env index, raw score) of the whole games finished since the last call, in env order
        within a step (empty unless the env reports games: `env.wrappers: atari`)."""
        games, self.finished_games = self.finished_games, []
        return games

    def drain_successes(self) -> list[tuple[int, str, bool]]:
        """(env index, task, success) of the episodes finished since the last call (empty unless
        the env reports `success`)."""
        successes, self.finished_successes = self.finished_successes, []
        return successes

    def state_dict(self) -> dict:
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "obs_norm": self.obs_norm.state_dict() if self.obs_norm else None,
            "reward_norm": self.reward_norm.stats.state_dict() if self.reward_norm else None,
            "non_finite": [self.nan_policy.replaced, self.nan_policy.skipped],
        }

    def load_state_dict(self, state: dict) -> None:
        self.env_steps, self.episodes = state["env_steps"], state["episodes"]
        self.nan_policy.replaced, self.nan_policy.skipped = state.get("non_finite", (0, 0))  # older: none
        if self.obs_norm is not None and state["obs_norm"] is not None:
            self.obs_norm.load_state_dict(state["obs_norm"])
        if self.reward_norm is not None and state["reward_norm"] is not None:
            self.reward_norm.stats.load_state_dict(state["reward_norm"])

    def close(self) -> None:
        for vector in self.stages:
            if isinstance(vector, AsyncVectorEnv):
                # A stop (SIGINT/SIGTERM raise in the main thread) that lands inside a step leaves
                # the subprocesses' answers half read: gymnasium's close would wait for the rest
                # forever; with a timeout it terminates them once it has waited that long.
                vector.close(timeout=ASYNC_CLOSE_TIMEOUT_S)
            else:
                vector.close()


def final_observations(info: dict, truncated_index: np.ndarray, obs):
    """The final observations of the truncated envs `truncated_index` (bootstrapped from), stacked
    in env order; empty, shaped as `obs`, with none."""
    if not len(truncated_index):
        return map_obs(lambda x: x[:0], obs)
    return stack_obs(info["final_obs"][truncated_index])


def chunk_info(info: dict, done: np.ndarray, key: str) -> np.ndarray:
    """A per-env value `ActionChunk` puts in its info: an env that ended its episode was reset in
    the same step, so its value is in the final info (SAME_STEP auto-reset)."""
    values = np.asarray(info[key], np.float64).copy() if key in info else np.zeros(len(done))
    if done.any():
        values[done] = np.asarray(info["final_info"][key], np.float64)[done]
    return values
