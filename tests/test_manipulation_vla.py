"""The Hugging Face VLA on the robot task set (issue 24, must-have 7): configs/sft_manipulation_vla.yaml
then configs/ppo_manipulation_vla.yaml through the real CLI — a tiny PaliGemma from
`fleetrl init-model` with LoRA, acting through its vocabulary on the arm's continuous actions in
chunks of 4 — and behaviour cloning of demonstrated chunks cut short by an episode's end."""

from __future__ import annotations

import numpy as np
import torch

from fleetrl.algos.common.logprobs import decision_logprob
from fleetrl.config.schema import EnvConfig
from fleetrl.envs import demonstrations
from fleetrl.envs.make import env_factory
from fleetrl.lerobot.reader import read_frames
from tests.support import PANDA_ENV, sft_then_train
from tests.support import PANDA_SFT_ENV as SFT_ENV

# 32×32 images, 2 envs; chunks of 4 on 6-step episodes: 4 steps, then 2 and the episode's end
# (a truncation, or a success) inside the chunk.
SMALL = [
    "env.num_envs=2",
    "algorithm.num_steps=4",
    "algorithm.minibatch_size=8",
    "runner.tensorboard=false",
    "runner.eval_interval=0",
]
RL_ENV = "env.kwargs={tasks: [reach, push], image_size: 32, max_steps: 6}"


def test_demonstrations_as_chunks_cut_short_at_the_episode_end(panda_demos):
    demos = panda_demos
    env = env_factory(EnvConfig(id=PANDA_ENV, kwargs=SFT_ENV))()
    spaces = env.observation_space, env.action_space
    env.close()
    single = demonstrations.load(str(demos), {}, "action", *spaces, 0.9)
    chunked = demonstrations.load(str(demos), {}, "action", *spaces, 0.9, chunk=4)
    lengths = np.diff(read_frames(demos, ["action"], "demos").episode_starts())
    assert single.steps is None and chunked.actions.shape == (sum(lengths), 4, 4)
    start = 0
    for length in lengths:  # row t: the expert's actions t … t+3 of its episode, zeros past its end
        for t in range(length):
            taken = min(4, length - t)
            assert chunked.steps[start + t] == taken
            np.testing.assert_array_equal(
                chunked.actions[start + t, :taken], single.actions[start + t : start + t + taken]
            )
            assert not chunked.actions[start + t, taken:].any()
        start += length
    np.testing.assert_array_equal(chunked.returns, single.returns)
    for name in single.obs:
        np.testing.assert_array_equal(chunked.obs[name], single.obs[name])


def test_a_decisions_logprob_sums_its_executed_actions_tokens():
    # 2 decisions, chunks of 3 actions of 2 tokens; decision 0 executed 3 actions, decision 1 only 1
    tokens = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2)
    assert decision_logprob(tokens, torch.tensor([3, 1])).tolist() == [0 + 1 + 2 + 3 + 4 + 5, 6 + 7]
    assert decision_logprob(tokens[:, 0], None).tolist() == [1, 13]  # one action of 2 tokens, no chunks
    assert decision_logprob(tokens[:, 0, 0], None).tolist() == [0, 6]  # one log-prob per sample


def test_vla_sft_then_ppo_from_it_through_the_cli(tmp_path, tiny_paligemma, panda_demos):
    demos = panda_demos
    model = f"model.path={tiny_paligemma}"
    sft, rl = sft_then_train(
        tmp_path,
        (
            "configs/sft_manipulation_vla.yaml",
            "env.kwargs={tasks: [reach, push], image_size: 32, max_steps: 8}",
            *SMALL,
            model,
            f"algorithm.demonstrations={demos}",
            "algorithm.updates_per_iteration=2",
            "runner.total_env_steps=32",
        ),
        (
            "configs/ppo_manipulation_vla.yaml",
            RL_ENV,
            *SMALL,
            model,
            "algorithm.update_epochs=1",
            "runner.total_env_steps=48",
        ),
    )
    assert [record["iteration"] for record in sft.metrics] == [1]
    assert sft.metrics[0]["grad_steps"] == 2 and sft.metrics[0]["bc_loss"] > 0

    assert f"policy weights from {sft.run_dir} (runner.init_from)" in rl.stderr
    assert [record["iteration"] for record in rl.metrics] == [1, 2]
    # 4 decisions of each env: 4 + 2 steps (the episode ends inside the chunk), twice
    assert [record["global_step"] for record in rl.metrics] == [24, 48]
    assert all(record["episode_length_last100"] == 6 for record in rl.metrics)
    assert all("success_rate" in record for record in rl.metrics)
