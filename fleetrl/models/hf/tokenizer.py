"""A word-level tokenizer built here, from a fixed vocabulary: nothing is downloaded.

`fleetrl init-model` needs a tokenizer for a randomly initialised VLA, and a real one (Gemma's,
SmolLM's) cannot be fetched. This one knows the prompt template's words, MiniGrid's mission
words and a few hundred robot-instruction words; anything else becomes `<unk>`. It is a
`tokenizers` WordLevel model wrapped as a transformers fast tokenizer, so it saves as the usual
`tokenizer.json` + `tokenizer_config.json` and loads with `AutoTokenizer` like any other.

Layout of the ids: the family's special tokens first (`<pad>` is 0), then the words, then the
family's extra tokens (PaliGemma's `<locNNNN>`/`<segNNN>`: its processor adds them when absent,
which would otherwise push new ids past the action tokens), and LAST the `bins` action tokens
`<act_0>`… — OpenVLA's convention: the action tokens are the last ids of the vocabulary.
"""

from __future__ import annotations

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"

PROMPT_WORDS = "in out what action should the robot take to ? : . , \n"
MINIGRID_WORDS = (
    "go to the a an pick up open put near get avoid and then after you door key ball box goal "
    "red green blue purple yellow grey lava wall floor object of use reach square corner"
)
ROBOT_WORDS = (
    "place push pull lift move turn slide stack unstack insert grasp release close drawer cabinet cup mug bowl "
    "plate block cube bottle can spoon fork knife towel sponge pot pan lid basket tray shelf table top bottom "
    "left right front back middle center inside into onto on off from with it its this that black white orange "
    "pink brown small large big tall short first second third side edge handle button switch knob faucet stove "
    "microwave oven sink fridge counter bin target position pose gripper arm hand hold rotate flip fold wipe "
    "pour fill empty carrot eggplant banana apple lemon corn potato"
)


def vocabulary_words() -> list[str]:
    """The words of the built-in vocabulary, lower case, in a fixed order."""
    words: list[str] = []
    for word in (PROMPT_WORDS + " \n " + MINIGRID_WORDS + " " + ROBOT_WORDS).split(" "):
        if word and word not in words:
            words.append(word)
    return words


def action_token(index: int) -> str:
    return f"<act_{index}>"


def build_tokenizer(specials: list[str], extras: list[str], bins: int):
    """The fast tokenizer described in the module docstring; `specials` start with PAD, EOS, BOS, UNK."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokens = [*specials, *vocabulary_words(), *extras, *(action_token(i) for i in range(bins))]
    vocab = {token: i for i, token in enumerate(tokens)}
    backend = Tokenizer(WordLevel(vocab, unk_token=UNK))
    backend.normalizer = normalizers.Lowercase()
    # words, punctuation and newlines are tokens; other whitespace separates them
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[ \t\r]+"), behavior="removed"),
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.Punctuation(),
        ]
    )
    backend.add_special_tokens([*specials, *extras, *(action_token(i) for i in range(bins))])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK
    )
    assert len(tokenizer) == len(tokens), "every token is in the base vocabulary"
    return tokenizer
