"""`algorithm.kl_coef`: the KL penalty to the reference policy (fleetrl/algos/ppo/reference.py).

In process and exact: the loss with the penalty is the plain loss plus kl_coef × the k3 mean,
computed by hand on a tiny token policy and a two-sample batch, at the action and token levels;
an update runs the reference over each sample once, not once an epoch; the default (0) builds no
reference; a resume whose checkpoint holds none is refused. Then real
inline runs: an RL run started from a short first run's weights (`runner.init_from`) trains with
the penalty, and the same run stopped and resumed keeps the very reference it started with — its
metrics (the KL to the reference among them) are the uninterrupted run's bit for bit, and its
checkpoint's reference is the first run's policy. The refusals of kl_coef where it cannot apply
are among tests/test_config_keys.py's rules relating keys."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.algos.ppo.spec import PPO
from fleetrl.algos.ppo.update import PPOBatch, ppo_loss
from fleetrl.checkpoint import load_latest
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError
from fleetrl.models.policy import Policy
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.progress import summary_line
from fleetrl.tracking.jsonl import read_metrics
from tests.ppo_support import acted_trajectory, cartpole_actor
from tests.support import REPO, TIMING_METRICS

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)


def token_policy() -> Policy:
    """Three action dimensions of 4 bins each: per-token log-probs (B, 3)."""
    config = load_config(None, ["model.action_bins=4", "model.hidden_sizes=[8]"])
    torch.manual_seed(0)
    return Policy.from_config(config.model, OBS, BOX)


@pytest.mark.parametrize("level", ["action_level", "token_level"])
def test_the_loss_with_kl_coef_is_the_plain_loss_plus_kl_coef_times_the_k3_mean(level, tmp_path):
    reference = token_policy()
    policy = copy.deepcopy(reference)
    with torch.no_grad():  # the policy has moved away from where it started
        policy.network.policy_head.weight.add_(torch.randn(policy.network.policy_head.weight.shape) * 0.5)
    obs = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    actions, logprobs, values = policy.act(obs)
    batch = PPOBatch(obs, actions, logprobs - 0.1, values, torch.tensor([1.0, -0.5]), torch.tensor([0.3, 0.7]))
    with torch.no_grad():  # what the actor's pass before the update gives (fleetrl/algos/ppo/batch_pass.py)
        ref = reference(obs, actions).logprobs
    with_reference = dataclasses.replace(batch, reference_logprobs=ref)
    keys = ["model.action_bins=4", f"algorithm.logprob_type={level}", "algorithm.norm_adv=false"]
    keys.append(f"runner.init_from={tmp_path}")  # kl_coef > 0 needs one (the reference is built here)
    plain_config = load_config(None, [*keys, "algorithm.ent_coef=0.0"]).algorithm
    kl_config = load_config(None, [*keys, "algorithm.ent_coef=0.0", "algorithm.kl_coef=0.25"]).algorithm

    plain, plain_parts, _ = ppo_loss(policy, batch, batch.advantages, plain_config, 0.2)
    loss, parts, _ = ppo_loss(policy, with_reference, batch.advantages, kl_config, 0.2)

    # by hand: d = log π_ref − log π of the taken action, k3 = e^d − d − 1; the policy's forward as
    # the loss runs it (autograd's kernels and no_grad's may differ in the last bit)
    new = policy(obs, actions).logprobs.detach()
    if level == "action_level":  # one ratio per action: its tokens' log-probs summed
        d = ref.sum(-1) - new.sum(-1)
        per_sample = d.exp() - d - 1
    else:  # one per token, the sample's term their mean
        d = ref - new
        per_sample = (d.exp() - d - 1).mean(-1)
    k3_mean = per_sample.sum() / 2.0
    assert k3_mean > 1e-3  # the penalty is there to see
    assert torch.equal(parts[4], k3_mean)
    assert torch.equal(loss.detach(), plain.detach() + k3_mean * 0.25)
    assert torch.equal(parts[:4], plain_parts[:4]) and plain_parts[4] == 0
    # at the reference itself the estimate is exactly 0
    assert ppo_loss(reference, with_reference, batch.advantages, kl_config, 0.2)[1][4] == 0


def test_an_update_runs_the_reference_over_each_sample_once_whatever_its_epochs(tmp_path):
    """Its log-probs of a sample are the same in every epoch: one pass before the update (32
    rows here, in pieces of the minibatch's 16), not one per minibatch in each of the 3 epochs."""
    actor = cartpole_actor(f"runner.init_from={tmp_path}", "algorithm.kl_coef=0.5", "algorithm.update_epochs=3")
    actor.load_policy_weights(copy.deepcopy(actor.policy.state_dict()))  # the start: the reference is built
    rows: list[int] = []
    actor.reference.register_forward_hook(lambda module, inputs, output: rows.append(len(inputs[1])))
    metrics = actor.train(acted_trajectory(actor), 0.0)
    assert rows == [16, 16]
    assert metrics["epochs"] == 3 and metrics["grad_steps"] == 6
    assert metrics["reference_kl"] > 0  # the policy left the reference within the update, and the KL saw it


def test_the_reference_is_a_frozen_copy_built_only_with_kl_coef_and_a_resume_needs_it(tmp_path):
    weights = token_policy().state_dict()
    keys = ["model.action_bins=4", "model.hidden_sizes=[8]", f"runner.init_from={tmp_path}"]
    default = ActorWorker(load_config(None, keys), OBS, BOX)
    default.load_policy_weights(weights)
    assert default.reference is None and "reference" not in default.state_dict()  # no copy, no extra forward

    actor = ActorWorker(load_config(None, [*keys, "algorithm.kl_coef=0.1"]), OBS, BOX)
    actor.load_policy_weights(weights)
    reference = actor.reference
    assert reference is not None and reference is not actor.policy and not reference.training
    assert not any(p.requires_grad for p in reference.parameters())
    for key, tensor in weights.items():
        assert torch.equal(reference.state_dict()[key], tensor), key
        assert reference.state_dict()[key].data_ptr() != actor.policy.state_dict()[key].data_ptr(), key

    saved = default.state_dict()  # a checkpoint of a run that started without the penalty
    with pytest.raises(ConfigError) as caught:
        actor.load_state_dict(saved)
    assert caught.value.key == "algorithm.kl_coef" and "checkpoints hold no reference policy" in str(caught.value)


# --- real inline runs -----------------------------------------------------------------------------

ITERATION = 64  # 4 envs × 16 steps
SMALL = [
    "env.id=tests.envs:MetronomeEnv",  # episodes end on the iteration boundary: a resume resets nothing
    "env.kwargs={length: 16}",
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "algorithm.anneal_lr=false",
    "algorithm.anneal_clip=false",
    "algorithm.lr=0.01",  # far enough from the start, in 4 iterations, for the KL to matter
    "runner.tensorboard=false",
    "runner.checkpoint_interval=100",
    "runner.seed=3",
]


def run(tmp_path: Path, name: str, iterations: int, *extra: str) -> dict:
    config = load_config(
        str(REPO / "configs" / "ppo_cartpole.yaml"),
        [
            *SMALL,
            f"runner.total_env_steps={iterations * ITERATION}",
            f"runner.run_dir={tmp_path}",
            f"runner.name={name}",
            *extra,
        ],
    )
    return Trainer(resolve(config), live_progress=False).train()


def untimed(run_dir: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_METRICS} for r in read_metrics(Path(run_dir))]


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_a_run_from_init_from_trains_with_the_kl_and_a_resume_keeps_the_same_reference(tmp_path):
    start = run(tmp_path, "start", 2)["run_dir"]  # the first stage, whose weights the RL run starts from
    started_with = load_latest(Path(start))["actor"]["policy"]
    kl = [f"runner.init_from={start}", "algorithm.kl_coef=0.5"]
    straight = run(tmp_path, "straight", 4, *kl)["run_dir"]
    half = run(tmp_path, "half", 2, *kl)["run_dir"]
    run(tmp_path, "ignored", 4, *kl, f"runner.resume={half}")

    resumed, uninterrupted = untimed(half), untimed(straight)
    assert [r["iteration"] for r in resumed] == [1, 2, 3, 4]
    assert resumed == uninterrupted  # the KL to the reference included, after the resume too
    assert all(r["reference_kl"] > 0 for r in resumed)
    assert resumed[-1]["reference_kl"] > resumed[0]["reference_kl"]  # the policy moved away from the start
    line = summary_line(read_metrics(Path(half))[-1], PPO.console_metrics)  # the console shows it
    assert line.endswith(f" | ref_kl {resumed[-1]['reference_kl']:.4f}"), line
    for run_dir in (half, straight):
        actor = load_latest(Path(run_dir))["actor"]
        assert actor["reference"].keys() == started_with.keys()
        for key, tensor in started_with.items():
            assert torch.equal(actor["reference"][key], tensor), key
        assert any(not torch.equal(actor["policy"][k], t) for k, t in started_with.items())  # it trained
