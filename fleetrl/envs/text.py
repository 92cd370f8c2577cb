"""Observations the rest of fleetrl can batch: every leaf a `Box` array, text as token ids.

A `Dict` observation (MiniGrid's `image` + `direction` + `mission`) may hold leaves that are no
arrays: a mission string, a `Discrete` direction. `ArrayObservations` converts them inside each
simulator, so the vector env already batches arrays and nothing downstream ever sees a string:

- text (Gymnasium `Text`, MiniGrid's `MissionSpace`) → token ids, a fixed-length int64 vector,
  0-padded (`Vocabulary`);
- `Discrete(n)` → a one-hot float32 vector of n;
- `Box` → unchanged.

The vocabulary is built from the space itself — nothing is downloaded: a `MissionSpace` knows its
mission template and every value of each placeholder, so its words (and the longest mission) are
known before the first reset; so does a `Text` space that lists its `sentences`
(`envs.manipulation.InstructionSpace`); any other `Text` space is tokenised per character of its
character set.
A word outside the vocabulary (a mission the template did not announce) becomes `<unk>`.
"""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np

from fleetrl.errors import ConfigError

PAD, UNKNOWN = 0, 1


class Vocabulary:
    """Token ids for a text space: 0 pads, 1 is `<unk>`, words (or characters) from 2."""

    def __init__(self, symbols: list[str], max_length: int, per_character: bool):
        self.symbols = ["<pad>", "<unk>", *sorted(set(symbols))]
        self.ids = {symbol: i for i, symbol in enumerate(self.symbols)}
        self.max_length, self.per_character = max_length, per_character

    @classmethod
    def of(cls, space: gym.Space) -> Vocabulary:
        if hasattr(space, "mission_func"):  # minigrid.core.mission.MissionSpace
            return cls.of_mission_space(space)
        if hasattr(space, "sentences"):  # a Text space that lists its sentences (envs.manipulation)
            words = [sentence.split() for sentence in space.sentences]
            return cls([word for sentence in words for word in sentence], max(map(len, words)), per_character=False)
        if isinstance(space, gym.spaces.Text):
            return cls(list(space.character_set), space.max_length, per_character=True)
        raise TypeError(f"no vocabulary for {space}")

    @classmethod
    def of_mission_space(cls, space) -> Vocabulary:
        choices = space.ordered_placeholders or []
        markers = [f"\0{i}\0" for i in range(len(choices))]
        template = space.mission_func(*markers).split()
        words = [word for word in template if word not in markers]
        words += [word for values in choices for value in values for word in str(value).split()]
        longest = {marker: max(len(str(v).split()) for v in values) for marker, values in zip(markers, choices)}
        return cls(words, sum(longest.get(word, 1) for word in template), per_character=False)

    def encode(self, text: str) -> np.ndarray:
        """`text` → int64 ids (max_length,), 0-padded; longer texts are cut at max_length."""
        pieces = list(text) if self.per_character else text.lower().split()
        ids = np.zeros(self.max_length, np.int64)
        for i, piece in enumerate(itertools.islice(pieces, self.max_length)):
            ids[i] = self.ids.get(piece, UNKNOWN)
        return ids

    def decode(self, ids: np.ndarray) -> str:
        pieces = [self.symbols[i] for i in ids if i != PAD]
        return ("" if self.per_character else " ").join(pieces)

    def space(self) -> TextIds:
        return TextIds(self)


class TextIds(gym.spaces.Box):
    """The Box of a text observation's token ids, carrying its `Vocabulary`: a model that reads
    text with a tokenizer of its own (a Hugging Face VLA) decodes the ids back to the words."""

    def __init__(self, vocabulary: Vocabulary):
        super().__init__(0, len(vocabulary.symbols) - 1, (vocabulary.max_length,), np.int64)
        self.vocabulary = vocabulary


def is_text(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Text) or hasattr(space, "mission_func")


class ArrayObservations(gym.ObservationWrapper):
    """Every observation leaf an array (see the module docstring); `vocabularies` by key."""

    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        space = env.observation_space
        leaves = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {None: space}
        self.vocabularies: dict = {}
        converted = {}
        for key, leaf in leaves.items():
            if is_text(leaf):
                self.vocabularies[key] = Vocabulary.of(leaf)
                converted[key] = self.vocabularies[key].space()
            elif isinstance(leaf, gym.spaces.Discrete):
                converted[key] = gym.spaces.Box(0.0, 1.0, (int(leaf.n),), np.float32)
            elif isinstance(leaf, gym.spaces.Box):
                converted[key] = leaf
            else:
                raise ConfigError(
                    "env.id",
                    env_id,
                    "an env whose observation is a Box, or a Dict of Box, Discrete and Text spaces",
                    f"its observation space is {space}; the leaf {key!r} is a {type(leaf).__name__}",
                )
        self.leaves = leaves
        self.observation_space = converted[None] if None in converted else gym.spaces.Dict(converted)

    def observation(self, observation):
        if None in self.leaves:
            return self.convert(None, self.leaves[None], observation)
        return {key: self.convert(key, leaf, observation[key]) for key, leaf in self.leaves.items()}

    def convert(self, key, leaf: gym.Space, value):
        if key in self.vocabularies:
            return self.vocabularies[key].encode(value)
        if isinstance(leaf, gym.spaces.Discrete):
            one_hot = np.zeros(int(leaf.n), np.float32)
            one_hot[int(value) - int(leaf.start)] = 1.0
            return one_hot
        return value


def needs_conversion(space: gym.Space) -> bool:
    """Whether a simulator's observations need `ArrayObservations` (anything but a Box)."""
    return not isinstance(space, gym.spaces.Box)
