"""Demonstrations for the supervised stage (`fleetrl sft`): a LeRobotDataset folder's frames as the
policy's observations and actions.

The dataset's features are matched to the env's observation keys by name (`feature_names`): an
instruction (a text observation) is LeRobot's `task`, a camera `image` is `observation.images.image`,
any other array `state` is `observation.state` — the names `fleetrl record` writes (`envs.recorder`),
so its folders need no mapping. A folder written elsewhere (LeRobot's own recorders, a published
dataset) names its features as its robot had them; `algorithm.features` maps the env's keys that
differ, e.g. `{image: observation.images.top}`, and `algorithm.action_feature` names its action.

Every mapped feature must have the shape the env's space has (a camera's frames (H, W, 3) as the
env renders them; a task's words are given ids by the env's own vocabulary, `envs.text`); what does
not fit is a `ConfigError` naming the key, what the dataset has and what the env needs — checked
against the folder's `info.json` before anything starts, and against the env's spaces as soon as
they are known (`check_spaces`), before any actor is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from fleetrl.envs.text import UNKNOWN, TextIds, is_text
from fleetrl.errors import ConfigError, nearest
from fleetrl.lerobot import layout
from fleetrl.lerobot.features import CAMERA_DTYPES
from fleetrl.lerobot.reader import TASK, read_frames
from fleetrl.observations import is_image, storage_dtype

log = logging.getLogger("fleetrl")
KEY = "algorithm.demonstrations"
FEATURES_KEY = "algorithm.features"
ACTION_KEY = "algorithm.action_feature"
REWARD = "next.reward"  # LeRobot's name for the reward that followed a frame's action
CONSTANT_STD = 1e-6  # an element whose demonstrations vary less is constant: not scaled (Demonstrations.statistics)
WHOLE = "observation"  # the env key `algorithm.features` names a non-Dict observation by


@dataclass
class Demonstrations:
    """Every step of every episode, concatenated: what behaviour cloning samples from."""

    obs: dict[str, np.ndarray]  # (N, ...) per key
    actions: np.ndarray  # (N, A) float32; with chunks of K (N, K, A): the K actions from each step on
    returns: np.ndarray  # (N,) float32: the discounted return from each step to its episode's end
    episodes: int
    steps: np.ndarray | None = None  # (N,) int64 with chunks: how many of the K actions the expert took

    def __len__(self) -> int:
        return len(self.actions)

    def statistics(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(mean, std) per element of each float observation key ("obs" for a non-Dict
        observation), over every step: what `model.standardize_inputs` scales the policy's inputs
        by. An element constant in every step gets std 1 (it is only centred)."""
        leaves = self.obs if isinstance(self.obs, dict) else {"obs": self.obs}
        out = {}
        for key, values in leaves.items():
            if values.dtype.kind == "f":
                flat = values.reshape(len(values), -1).astype(np.float64)
                std = flat.std(0)
                out[key] = (flat.mean(0), np.where(std < CONSTANT_STD, 1.0, std))
        return out


def feature_names(space: gym.Space) -> dict[str | None, str]:
    """env observation key → the dataset feature it is recorded as (None: a non-Dict observation):
    text → `task`; a camera (uint8, 3 axes) → `observation.images.<key>`; another array →
    `observation.<key>`. A whole observation that is one array is `observation.state` (a camera:
    `observation.image`), as in LeRobot's single-camera and state-only datasets."""
    if not isinstance(space, gym.spaces.Dict):
        return {None: "observation.image" if is_image(space) else "observation.state"}
    names = {}
    for key, leaf in space.spaces.items():
        if is_text(leaf) or isinstance(leaf, TextIds):
            names[key] = TASK
        elif is_image(leaf):
            names[key] = f"observation.images.{key}"
        else:
            names[key] = f"observation.{key}"
    return names


def leaves_of(space: gym.Space) -> dict[str | None, gym.Space]:
    """A Dict observation's leaves by key; a whole observation that is one space under None."""
    return dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {None: space}


def mapping(features: dict[str, str], space: gym.Space) -> dict[str | None, str]:
    """The env's observation keys → dataset features: `feature_names`, with `algorithm.features`'
    entries (`features`) in place of the defaults they name."""
    names = feature_names(space)
    env_keys = {WHOLE if key is None else key: key for key in names}
    for key, feature in features.items():
        if key not in env_keys:
            raise ConfigError(
                f"{FEATURES_KEY}.{key}",
                feature,
                f"entries for the env's observation keys {sorted(env_keys)}",
                nearest(key, env_keys),
            )
        names[env_keys[key]] = feature
    return names


def check_folder(path: str, features: dict[str, str], action_feature: str) -> dict:
    """The dataset in `path` readable, with the features `algorithm.features` and
    `algorithm.action_feature` name (the config alone: before anything starts); its info."""
    info = layout.read_info(path, KEY)
    for key, feature in features.items():
        require_feature(f"{FEATURES_KEY}.{key}", feature, path, info["features"])
    require_feature(ACTION_KEY, action_feature, path, info["features"])
    return info


def require_feature(config_key: str, feature: str, path: str, declared: dict) -> None:
    if feature != TASK and feature not in declared:
        raise ConfigError(
            config_key,
            feature,
            f"a feature of the dataset in {path}: one of {sorted(declared)}",
            nearest(feature, declared),
        )


def check_spaces(
    path: str,
    features: dict[str, str],
    action_feature: str,
    vf_coef: float,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> dict[str | None, str]:
    """Every env observation key mapped to a dataset feature of its shape, the action of the
    action space's shape, and rewards when the value loss needs them; the mapping."""
    info = check_folder(path, features, action_feature)
    declared = info["features"]
    names = mapping(features, observation_space)
    leaves = leaves_of(observation_space)
    for key, feature in names.items():
        config_key = f"{FEATURES_KEY}.{WHOLE if key is None else key}"
        leaf = leaves[key]
        if feature == TASK:
            if not isinstance(leaf, TextIds):
                raise ConfigError(config_key, feature, f"a feature of the env's shape {leaf.shape}: task is text")
            continue
        require_feature(config_key, feature, path, declared)
        shape = tuple(declared[feature]["shape"])
        if shape != tuple(leaf.shape) and not (shape == (1,) and leaf.shape == ()):
            camera = (
                " (a camera's frames: height, width, channels)" if declared[feature]["dtype"] in CAMERA_DTYPES else ""
            )
            raise ConfigError(
                config_key,
                feature,
                f"a feature of the env's shape {tuple(leaf.shape)}{camera}",
                f"the dataset's is {shape}",
            )
    step_shape = tuple(action_space.shape)
    if tuple(declared[action_feature]["shape"]) != step_shape:
        raise ConfigError(
            ACTION_KEY,
            action_feature,
            f"a feature of the env's action shape {step_shape}",
            f"the dataset's is {tuple(declared[action_feature]['shape'])}",
        )
    if vf_coef > 0 and REWARD not in declared:
        raise ConfigError(
            KEY,
            path,
            f"a dataset with {REWARD} (the value loss learns its returns)",
            "it has none: set algorithm.vf_coef=0 to clone its actions without a critic",
        )
    return names


def load(
    path: str,
    features: dict[str, str],
    action_feature: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    gamma: float,
    chunk: int = 1,
    vf_coef: float = 0.0,
) -> Demonstrations:
    """The dataset in folder `path` (checked: `check_spaces`) as the env's observations, its
    actions and returns discounted with `gamma` (zeros without rewards, when `vf_coef` is 0);
    with `chunk` K > 1 (`model.action_chunk`) each step's action is the chunk of the K actions the
    expert took from it on (`chunked`)."""
    names = check_spaces(path, features, action_feature, vf_coef, observation_space, action_space)
    declared = layout.read_info(path, KEY)["features"]
    wanted = sorted({*names.values(), action_feature, *([REWARD] if REWARD in declared else [])})
    frames = read_frames(path, wanted, KEY)
    leaves = leaves_of(observation_space)
    obs = {}
    for key, feature in names.items():
        values = frames.values[feature]
        if feature == TASK:
            vocabulary = leaves[key].vocabulary
            encoded = {text: vocabulary.encode(text) for text in set(values)}
            unknown = sorted(text for text, ids in encoded.items() if UNKNOWN in ids)
            if unknown:
                log.warning("%s: words the env's instructions never use read as <unk>, in %s", path, unknown)
            obs[key] = np.stack([encoded[text] for text in values])
        else:
            obs[key] = values.reshape(len(values), *leaves[key].shape).astype(storage_dtype(leaves[key]), copy=False)
    starts = frames.episode_starts()
    actions = frames.values[action_feature].astype(np.float32)
    rewards = frames.values[REWARD].reshape(-1) if REWARD in frames.values else np.zeros(len(frames), np.float32)
    returns = np.concatenate([discounted(rewards[a:b], gamma) for a, b in zip(starts[:-1], starts[1:])])
    steps = None
    if chunk > 1:
        pieces = [chunked(actions[a:b], chunk) for a, b in zip(starts[:-1], starts[1:])]
        actions = np.concatenate([piece[0] for piece in pieces])
        steps = np.concatenate([piece[1] for piece in pieces])
    return Demonstrations(
        obs[None] if None in obs else obs, actions, returns.astype(np.float32), len(starts) - 1, steps
    )


def chunked(actions: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """One episode's (T, A) actions → (T, K, A) chunks, row t holding actions t … t+K−1, and (T,)
    how many of them exist: fewer than K in the episode's last K−1 steps, where the rest are
    zeros — a chunk cut short by the episode's end, as in RL (the loss counts only the first k)."""
    length = len(actions)
    padded = np.concatenate([actions, np.zeros((chunk - 1, *actions.shape[1:]), actions.dtype)])
    windows = np.stack([padded[t : t + chunk] for t in range(length)])
    return windows, np.minimum(chunk, length - np.arange(length)).astype(np.int64)


def discounted(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Return-to-go of each step of one episode."""
    out = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out
