"""Image and Dict observations end to end (issue 13): what the env shows reaches trajectories
exactly and stays uint8; text becomes token ids from the env's own vocabulary; PPO trains on
them with the env worker in its own Ray process; the MiniGrid config trains and resumes from its
checkpoint; SAC's replay keeps images uint8; a model key that does not fit the observation is a
config error."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from fleetrl.algos.registry import algorithm_spec
from fleetrl.checkpoint import load_latest
from fleetrl.cli import main
from fleetrl.config.model_sections import MlpModelConfig, TransformerModelConfig
from fleetrl.config.schema import EnvConfig
from fleetrl.envs.text import Vocabulary
from fleetrl.errors import ConfigError
from fleetrl.models.encoders import ObservationEncoder, TextEncoder
from fleetrl.models.policy import Policy
from fleetrl.observations import map_obs
from fleetrl.plan.load import load_config
from fleetrl.plan.rules import check_spaces
from fleetrl.step_result import StepResult
from fleetrl.trajectory import Trajectory
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.image_envs import MISSIONS, expected_image
from tests.support import REPO, train

LENGTH = 3  # CountingImages' episodes: returns 1 + 2 + 3
MISSION_SPACE = gym.spaces.Text(12, charset="abcdefghijklmnopqrstuvwxyz ")


def collect(
    env_config: EnvConfig, model: MlpModelConfig | TransformerModelConfig, steps: int
) -> tuple[Trajectory, Policy]:
    """`steps` steps of a PPO rollout worker and an env worker; the trajectory and the policy."""
    env = EnvWorker(env_config, 0.99, seed=0)
    torch.manual_seed(0)
    rollout = RolloutWorker(Policy.from_config(model, *env.spaces()))
    return collect_with(env, rollout, steps), rollout.policy


def collect_with(env: EnvWorker, rollout: RolloutWorker, steps: int) -> Trajectory:
    """One lane of `steps` steps, collected as the collector does: env worker ⇄ rollout worker."""
    rollout.configure_lanes([env.num_envs], steps, *env.spaces())
    step = StepResult.initial(env.reset())
    for t in range(steps + 1):
        actions = rollout.act(0, t, step)
        if actions is not None:
            step = env.step(actions)
    env.close()
    return rollout.trajectory()


@pytest.mark.parametrize(
    "dict_obs, model_id",
    [(True, "mlp"), (True, "transformer"), (False, "mlp")],
    ids=["dict-mlp", "dict-transformer", "image-mlp"],
)
def test_observations_reach_the_trajectory_exactly_and_images_stay_uint8(dict_obs, model_id):
    # Dict observations with a CHW image; a plain Box image HWC
    kwargs = {"dict_obs": dict_obs, "channels_last": not dict_obs}
    env_config = EnvConfig(id="tests.image_envs:CountingImages", kwargs=kwargs, num_envs=2)
    steps = 7
    trajectory, policy = collect(
        env_config,
        MlpModelConfig(embed_dim=16) if model_id == "mlp" else TransformerModelConfig(embed_dim=16, num_heads=2),
        steps,
    )
    image = trajectory.obs["image"] if dict_obs else trajectory.obs
    shape = (3, 7, 7) if dict_obs else (7, 7, 3)
    assert image.dtype == torch.uint8 and image.shape == (steps, 2, *shape)  # no float copy of any image
    vocabulary = Vocabulary.of(MISSION_SPACE)
    for t in range(steps):
        episode, t_in_episode = divmod(t, LENGTH)  # the first obs of the next episode follows the last step
        for env in range(2):
            expected = expected_image(env, episode, t_in_episode, channels_last=not dict_obs)
            assert np.array_equal(image[t, env].numpy(), expected), (t, env)
            if dict_obs:
                assert vocabulary.decode(trajectory.obs["mission"][t, env].numpy()) == MISSIONS[env % 2]
                assert trajectory.obs["direction"][t, env].tolist() == np.eye(4)[t_in_episode % 4].tolist()
    assert trajectory.rewards[:, 0].tolist() == [1, 2, 3, 1, 2, 3, 1]
    # the loss path reads the recorded batch: the same log-probs and values the rollout stored
    flat = map_obs(lambda x: x.flatten(0, 1), trajectory.obs)
    logprobs, _, values, _ = policy(flat, trajectory.actions.flatten(0, 1))
    assert torch.allclose(logprobs, trajectory.logprobs.flatten(0, 1), atol=1e-5)
    assert torch.allclose(values, trajectory.values.flatten(0, 1), atol=1e-5)


def test_encoders_output_shapes():
    nature = ObservationEncoder(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))  # Atari's stacked frames, CHW
    assert nature.encoders["obs"].layers[0].kernel_size == (8, 8)
    assert nature(torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)).shape == (5, 512)
    grid = ObservationEncoder(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8))  # MiniGrid's view, HWC
    assert grid.encoders["obs"].layers[0].kernel_size == (2, 2)
    assert grid(torch.randint(0, 11, (5, 7, 7, 3), dtype=torch.uint8)).shape == (5, 64)
    space = gym.spaces.Dict(
        image=gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
        mission=gym.spaces.Box(0, 11, (5,), np.int64),
        direction=gym.spaces.Box(0.0, 1.0, (4,), np.float32),
    )
    both = ObservationEncoder(space, embed_dim=8)
    obs = {
        "image": torch.randint(0, 11, (5, 7, 7, 3), dtype=torch.uint8),
        "mission": torch.tensor([[4, 10, 9, 5, 3]] * 5),
        "direction": torch.eye(4)[[0, 1, 2, 3, 0]],
    }
    assert both.out_features == 4 + 64 + 128 and both(obs).shape == (5, both.out_features)


@pytest.mark.parametrize("side, scale", [(40, 1 / 255), (7, 1.0)], ids=["camera-image", "grid"])
def test_the_default_mlp_flattens_uint8_images_to_float_at_the_model_and_learns_from_them(side, scale):
    """`model.image_encoder: flatten` with the default `model.id: mlp`: the uint8 image becomes
    float only in the model, scaled as the CNNs scale it (camera images to [0, 1], grid codes as
    they are), and a gradient step on it changes the first layer."""
    space = gym.spaces.Box(0, 255, (side, side, 3), np.uint8)
    torch.manual_seed(0)
    policy = Policy.from_config(MlpModelConfig(image_encoder="flatten"), space, gym.spaces.Discrete(2))
    images = torch.randint(0, 256, (6, side, side, 3), dtype=torch.uint8)
    features = policy.network.encoder(images)
    assert features.dtype == torch.float32 and torch.equal(features, images.flatten(1).float() * scale)
    first = next(policy.parameters())
    before = first.detach().clone()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    logprob, entropy, value, _ = policy(images, torch.tensor([0, 1] * 3))
    (-logprob.mean() + value.pow(2).mean()).backward()
    optimizer.step()
    assert first.shape[1] == side * side * 3 and not torch.equal(first, before)


def test_text_encoder_reads_each_instruction_up_to_its_last_word():
    encoder = TextEncoder(12, 8)
    padded = torch.tensor([[4, 10, 3, 0, 0], [4, 10, 9, 5, 3]])
    unpadded = encoder.gru(encoder.embedding(torch.tensor([[4, 10, 3]])))[0][:, -1]
    features = encoder(padded)
    assert features.shape == (2, 128)
    assert torch.allclose(features[0], unpadded[0], atol=1e-6)  # padding changes nothing
    assert not torch.allclose(features[0], features[1])


@pytest.mark.parametrize("bins", [None, 5], ids=["discrete", "tokens"])
def test_transformer_log_probs_and_entropies_match_a_direct_computation(bins):
    space = gym.spaces.Dict(
        image=gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), mission=gym.spaces.Box(0, 11, (5,), np.int64)
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32) if bins else gym.spaces.Discrete(7)
    torch.manual_seed(0)
    config = TransformerModelConfig(action_bins=bins, embed_dim=16, num_heads=2, patch_size=1)
    policy = Policy.from_config(config, space, action_space)
    assert isinstance(policy.network.blocks, torch.nn.ModuleList) and len(policy.network.blocks) == 2
    with torch.no_grad():
        policy.network.action_head.weight.normal_(0, 1.0)  # visibly non-uniform distributions
    obs = {
        "image": torch.randint(0, 11, (6, 7, 7, 3), dtype=torch.uint8),
        "mission": torch.tensor([[4, 10, 9, 5, 3], [4, 10, 3, 0, 0]] * 3),
    }
    actions, logprobs, values = policy.act(obs)
    logprobs_again, entropy, values_again, _ = policy(obs, actions)
    logits, value = policy.network(obs)
    if bins:  # one categorical per action dimension, over the bins
        distribution = torch.distributions.Categorical(logits=logits.view(6, 3, bins))
        chosen = torch.round((actions + 1.0) / (2.0 / (bins - 1))).long()
        assert logprobs.shape == entropy.shape == (6, 3)
    else:
        distribution = torch.distributions.Categorical(logits=logits)
        chosen = actions
        assert logprobs.shape == entropy.shape == (6,)
    expected = distribution.log_prob(chosen)
    assert torch.allclose(logprobs, expected, atol=1e-5) and torch.allclose(logprobs_again, expected, atol=1e-5)
    assert torch.allclose(entropy, distribution.entropy(), atol=1e-5)
    assert torch.allclose(values, value) and torch.allclose(values_again, value) and value.shape == (6,)
    # the instruction is read: another mission, another distribution
    other = dict(obs, mission=torch.tensor([[4, 10, 9, 6, 3], [4, 10, 7, 0, 0]] * 3))
    assert not torch.allclose(policy.network(other)[0], logits)


def test_transformer_keypoints_are_where_the_image_shows_what_they_detect():
    """`model.keypoints`: each keypoint is the expected (x, y) of its feature map, so a keypoint that
    detects red sits on a red dot and follows it; the policy reads the keypoints as its image."""
    space = gym.spaces.Dict(image=gym.spaces.Box(0, 255, (64, 64, 3), np.uint8))
    config = TransformerModelConfig(action_bins=5, embed_dim=16, num_heads=2, keypoints=4)
    policy = Policy.from_config(config, space, gym.spaces.Box(-1.0, 1.0, (3,), np.float32))
    keypoints = policy.network.inputs["image"]  # the policy's own trunk
    assert keypoints.count == 4 and policy.network.position.shape == (4 + 3 + 1, 16)
    first, second, third = (m for m in keypoints.features if isinstance(m, torch.nn.Conv2d))
    with torch.no_grad():  # keypoint 0 detects red minus green, sharply
        for conv in (first, second, third):
            conv.weight.zero_(), conv.bias.zero_()
        first.weight[0, 0, 2, 2], first.weight[0, 1, 2, 2] = 1.0, -1.0
        second.weight[0, 0, 1, 1] = 1.0
        third.weight[0, 0] = 100.0
        policy.network.action_head.weight.normal_(0, 1.0)

    def red_dot(row: int, column: int) -> torch.Tensor:
        image = torch.zeros(1, 64, 64, 3, dtype=torch.uint8)
        image[0, row : row + 2, column : column + 2, 0] = 255
        return image

    # at half resolution (the first convolution's stride) the dot is at (row/2, column/2) of 32×32
    for row, column in [(10, 40), (50, 4)]:
        expected = torch.tensor([column / 2, row / 2]) * 2 / 31 - 1
        found = keypoints.expected_positions(red_dot(row, column))[0, 0]
        assert torch.allclose(found, expected, atol=1e-3), (row, column, found)
    logits = [policy.network({"image": red_dot(r, c)})[0] for r, c in [(10, 40), (50, 4)]]
    assert not torch.allclose(*logits)


@pytest.mark.parametrize("shared_trunk", [True, False], ids=["shared", "own_critic"])
def test_transformer_value_gradients_reach_the_policy_only_through_a_shared_trunk(shared_trunk):
    """`model.shared_trunk: false` gives the transformer's value a trunk of its own: the value loss
    then changes no parameter the actions depend on (PPO's critic warm-up leaves the policy alone)."""
    space = gym.spaces.Dict(
        image=gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), state=gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    )
    config = TransformerModelConfig(action_bins=5, embed_dim=16, num_heads=2, shared_trunk=shared_trunk)
    network = Policy.from_config(config, space, gym.spaces.Box(-1.0, 1.0, (2,), np.float32)).network
    obs = {"image": torch.randint(0, 255, (4, 8, 8, 3), dtype=torch.uint8), "state": torch.randn(4, 3)}
    logits, value = network(obs)
    value.sum().backward()
    policy_side = {name for name, _ in network.named_parameters() if not name.startswith(("critic.", "value_head."))}
    moved = {name for name, p in network.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert logits.shape == (4, 2 * 5)
    if shared_trunk:
        assert network.critic is None and {"blocks.0.linear1.weight", "inputs.image.project.weight"} <= moved
    else:
        assert moved & policy_side == set()
        assert {"critic.blocks.0.linear1.weight", "critic.inputs.image.project.weight", "value_head.weight"} <= moved
        assert len(network.wrap_units()) == 4  # each trunk's 2 blocks


def test_transformer_critic_keys_are_read_by_the_critic_alone():
    """`model.critic_keys`: an asymmetric critic. The keys it names change the value, never the
    actions; a key the observation lacks, every key, or a shared trunk is a config error."""
    space = gym.spaces.Dict(
        image=gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), sim_state=gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    )
    actions = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    config = TransformerModelConfig(action_bins=5, embed_dim=16, num_heads=2, shared_trunk=False)
    network = Policy.from_config(
        TransformerModelConfig(**{**vars(config), "critic_keys": ["sim_state"]}), space, actions
    ).network
    assert set(network.inputs) == {"image"} and set(network.critic.inputs) == {"image", "sim_state"}
    obs = {"image": torch.randint(0, 255, (4, 8, 8, 3), dtype=torch.uint8), "sim_state": torch.randn(4, 6)}
    logits, value = network(obs)
    other_logits, other_value = network(dict(obs, sim_state=torch.randn(4, 6)))
    assert torch.equal(logits, other_logits) and not torch.allclose(value, other_value)
    for changes, expected in [
        ({"critic_keys": ["target"]}, "unknown: ['target']"),
        ({"critic_keys": ["image", "sim_state"]}, "it lists every key"),
        ({"critic_keys": ["sim_state"], "shared_trunk": True}, "model.shared_trunk is false"),
    ]:
        with pytest.raises(ConfigError, match="model.critic_keys") as error:
            Policy.from_config(TransformerModelConfig(**{**vars(config), **changes}), space, actions)
        assert expected in str(error.value)
    # where no model has a second trunk to give the critic the keys are not the model's: refused as
    # the config loads, before any worker or model (a VLA's value head reads its own hidden state)
    for overrides, key, expected in [
        (["model.id=mlp", "model.critic_keys=[sim_state]"], "model.critic_keys", "of model.id transformer, not of mlp"),
        (
            ["model.id=hf", "model.shared_trunk=false"],
            "model.shared_trunk",
            "of model.id mlp and transformer, not of hf",
        ),
    ]:
        with pytest.raises(ConfigError, match=key) as error:
            load_config(None, overrides)
        assert expected in str(error.value)


def test_transformer_predict_keys_teach_the_keypoints_where_things_are():
    """`model.predict_keys`: a linear read-out of the keypoints predicts the key, and its squared
    error is the loss path's fourth output. The policy never reads the key (its actions do not
    change with it), and that error alone, minimised, teaches a keypoint to follow a red dot it
    was not built to detect. Keys the observation lacks, every key, or a model without keypoints
    is a config error."""
    space = gym.spaces.Dict(
        image=gym.spaces.Box(0, 255, (16, 16, 3), np.uint8), where=gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    )
    actions = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    config = TransformerModelConfig(action_bins=5, embed_dim=16, num_heads=2, keypoints=4)
    torch.manual_seed(0)
    policy = Policy.from_config(TransformerModelConfig(**{**vars(config), "predict_keys": ["where"]}), space, actions)
    network = policy.network
    assert set(network.inputs) == {"image"} and network.predictor.in_features == 2 * 4

    def red_dots(count: int) -> dict:
        """Images with a 2×2 red dot anywhere; `where` is its (x, y) in [-1, 1]."""
        rows, columns = torch.randint(0, 15, (count,)), torch.randint(0, 15, (count,))
        images = torch.zeros(count, 16, 16, 3, dtype=torch.uint8)
        for k in range(count):
            images[k, rows[k] : rows[k] + 2, columns[k] : columns[k] + 2, 0] = 255
        return {"image": images, "where": torch.stack([columns, rows], dim=1).float() / 7 - 1}

    obs = red_dots(8)
    chosen = torch.zeros(8, 2)
    outputs = policy(obs, chosen)
    truth = obs["where"]
    expected = network.predictor(network.inputs["image"].expected_positions(obs["image"]).flatten(1)) - truth
    assert torch.allclose(outputs.prediction_error, expected.pow(2).mean(-1), atol=1e-6)
    other = policy(dict(obs, where=-truth), chosen)
    assert torch.equal(other.logprobs, outputs.logprobs) and torch.equal(other.value, outputs.value)
    assert not torch.allclose(other.prediction_error, outputs.prediction_error)
    # the prediction error alone trains the keypoint CNN: its dots' positions are then read out
    # from the keypoints to within a fifth of their spread (a guess of the mean: the spread itself)
    optimizer = torch.optim.Adam(network.parameters(), lr=3e-3)
    for _ in range(400):
        loss = policy(red_dots(32), torch.zeros(32, 2)).prediction_error.mean()
        optimizer.zero_grad(), loss.backward(), optimizer.step()
    held_out = red_dots(256)
    with torch.no_grad():
        error = policy(held_out, torch.zeros(256, 2)).prediction_error.mean()
    assert error < 0.2 * held_out["where"].var(0).mean(), error
    for changes, key, expected in [
        ({"predict_keys": ["target"]}, "model.predict_keys", "unknown: ['target']"),
        ({"predict_keys": ["where"], "critic_keys": ["image"], "shared_trunk": False}, "model", "every key"),
    ]:
        with pytest.raises(ConfigError, match=key) as error:
            Policy.from_config(TransformerModelConfig(**{**vars(config), **changes}), space, actions)
        assert expected in str(error.value)
    for overrides, key, expected in [
        (["model.id=transformer"], "model.predict_keys", "[] unless model.keypoints is set"),
        (["model.id=mlp", "model.keypoints=4"], "model.keypoints", "of model.id transformer, not of mlp"),
    ]:
        with pytest.raises(ConfigError, match=key) as error:
            load_config(None, [*overrides, "model.predict_keys=[sim_state]"])
        assert expected in str(error.value)


def test_sac_keeps_image_observations_uint8_in_its_replay_buffer():
    overrides = [
        "algorithm.name=sac",
        "env.id=tests.image_envs:CountingImages",
        "env.kwargs={continuous: true}",
        "env.num_envs=2",
        "algorithm.num_steps=4",
        "algorithm.learning_starts=0",
        "algorithm.minibatch_size=4",
        "algorithm.buffer_size=64",
    ]
    config = load_config(None, overrides)
    env = EnvWorker(config.env, 0.99, seed=0)
    spec = algorithm_spec("sac")
    rollout, actor = spec.rollout_class().from_config(config, *env.spaces()), spec.actor_class()(config, *env.spaces())
    trajectory = collect_with(env, rollout, 4)
    metrics = actor.train(trajectory, 0.0)  # stores the steps, then trains on samples of them
    assert metrics["grad_steps"] > 0 and np.isfinite(metrics["q_loss"])
    replay = actor.replay
    assert replay.obs.dtype == np.uint8 and trajectory.next_obs.dtype == torch.uint8
    obs, _, rewards, not_terminated, next_obs = replay.gather(torch.arange(len(replay)))
    assert obs.dtype == next_obs.dtype == torch.uint8
    for row in range(len(replay)):  # slot-major rows: step row // 2 of env row % 2
        t, env_index = divmod(row, 2)
        episode, t_in_episode = divmod(t, LENGTH)
        assert np.array_equal(obs[row].numpy(), expected_image(env_index, episode, t_in_episode))
        if not_terminated[row]:  # where the episode goes on, the next observation is the next step's
            assert np.array_equal(next_obs[row].numpy(), expected_image(env_index, episode, t_in_episode + 1))
        assert rewards[row] == t_in_episode + 1


def test_mission_vocabulary_is_built_from_the_minigrid_space():
    import minigrid  # noqa: F401 (the `minigrid` extra, in `test`: registers the ids)

    from fleetrl.envs.make import env_factory

    env = env_factory(EnvConfig(id="MiniGrid-GoToObject-6x6-N2-v0"))()
    vocabulary = env.vocabularies["mission"]
    assert vocabulary.max_length == 5  # "go to the <colour> <object>"
    for seed in range(40):  # every mission these episodes draw is spelt in known words, none <unk>
        obs, _ = env.reset(seed=seed)
        assert vocabulary.decode(obs["mission"]) == env.unwrapped.mission
    assert obs["image"].dtype == np.uint8 and obs["direction"].shape == (4,)


def write_config(path: Path, *, dict_obs: bool, **sections) -> Path:
    config = {
        "env": {
            "id": "tests.image_envs:CountingImages",
            "kwargs": {"dict_obs": dict_obs, "channels_last": not dict_obs},
            "num_envs": 4,
        },
        "algorithm": {"name": "ppo", "num_steps": 8, "minibatch_size": 16, "update_epochs": 1},
        "model": {"id": "transformer", "embed_dim": 16, "num_layers": 1, "num_heads": 2},
        "runner": {"total_env_steps": 64, "tensorboard": False, "checkpoint_interval": 1},
    }
    for section, keys in sections.items():
        config[section] = keys if section == "model" else {**config[section], **keys}  # a model is its own keys
    path.write_text(yaml.safe_dump(config))
    return path


ON_RAY = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0, rollout: 0, env: 1}",
]


def test_ppo_trains_on_dict_observations_with_the_env_worker_in_its_own_ray_process(tmp_path):
    config = write_config(tmp_path / "config.yaml", dict_obs=True)
    result = train(config, *ON_RAY, runs=tmp_path / "runs", timeout=240).succeeded()
    assert_trained_on_counting_images(result)


def assert_trained_on_counting_images(result) -> None:
    """Two iterations of 4 envs × 8 steps, every episode's return the env's 1 + 2 + 3."""
    assert [r["global_step"] for r in result.metrics] == [32, 64]
    assert all(np.isfinite(r["policy_loss"]) and np.isfinite(r["value_loss"]) for r in result.metrics)
    assert result.metrics[-1]["episode_return_last100"] == 6.0
    assert result.summary["episodes"] == 4 * ((64 // 4) // LENGTH)


def test_the_minigrid_transformer_config_trains_and_resumes_from_its_checkpoint(tmp_path):
    import minigrid  # noqa: F401 (registers the ids)

    config = REPO / "configs" / "ppo_minigrid_transformer.yaml"
    small = ["env.num_envs=4", "algorithm.num_steps=16", "algorithm.minibatch_size=32", "runner.tensorboard=false"]
    small += ["env.normalize_obs=true", "runner.checkpoint_interval=1"]  # direction, the one float key, normalised
    first = train(config, *small, "runner.total_env_steps=128", runs=tmp_path / "runs").succeeded()
    assert [r["global_step"] for r in first.metrics] == [64, 128] and first.summary["episodes"] > 0
    obs_norm = load_latest(first.run_dir)["env"][0]["obs_norm"]  # env rank 0's state
    assert set(obs_norm) == {"direction"}, "images and token ids are never normalised"
    assert obs_norm["direction"]["count"] >= 128
    resumed = train(
        config, *small, f"runner.resume={first.run_dir}", "runner.total_env_steps=256", runs=tmp_path / "runs"
    ).succeeded()
    assert f"resumed {first.run_dir} at iteration 2, 128 env steps" in resumed.stderr
    assert [r["global_step"] for r in resumed.metrics if r["iteration"] > 2] == [192, 256]


def test_a_model_key_that_does_not_fit_the_images_is_a_config_error(tmp_path, capfd):
    config = write_config(tmp_path / "config.yaml", dict_obs=True, model={"id": "mlp"})
    code = main(["train", str(config), f"runner.run_dir={tmp_path}", "model.image_encoder=nature_cnn", "--skip-doctor"])
    message = capfd.readouterr().err  # the controller process says it (the env's spaces are known there)
    assert code == 2, message[-3000:]
    assert "config error at 'model.image_encoder': got 'nature_cnn'" in message
    assert "one of 'auto', 'grid_cnn', 'flatten'" in message and "images are 7×7" in message
    assert "Traceback" not in message
    ppg = load_config(config, ["algorithm.name=ppg", "model.id=mlp"])
    env = EnvWorker(ppg.env, 0.99, seed=0)
    with pytest.raises(ConfigError, match="ppg's auxiliary phase stores Box observations only"):
        check_spaces(ppg, *env.spaces())
    env.close()


MINIGRID_TARGET = 0.8  # docs/benchmarks.md (git log benchmarks/README.md): reached at 233k env steps; the RL Zoo's tuned PPO reports 0.56 after 5M


@pytest.mark.slow
def test_minigrid_transformer_config_reaches_its_target(tmp_path):
    import minigrid  # noqa: F401 (registers the ids)

    config = REPO / "configs" / "ppo_minigrid_transformer.yaml"
    overrides = [f"runner.target_return={MINIGRID_TARGET}", "runner.tensorboard=false"]
    result = train(config, *overrides, runs=tmp_path / "runs", timeout=5400).succeeded()
    assert result.summary["target_reached"], result.summary
