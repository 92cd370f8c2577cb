"""Keys that moved or went, and configs saved before they did.

A user's config naming a key that moved or was removed is exit 2 saying what replaced it
(`MOVED_KEYS`, read by the loader's unknown-key message). A run directory's `config.yaml` is
different: fleetrl wrote it with *every* key of the schema of its day, so a run saved before the
`model` section was split by kind names every model key, each at its default where the run never
set it. `upgrade_saved_section` recognises such a section — it holds every key the old schema
wrote, which no hand-written config does — and drops the keys its kind no longer has while they
hold the old default (what the dump wrote for a key the run never set), so that `fleetrl eval`,
`fleetrl export` and a resume given the saved file keep working. A retired key holding anything
else was set by the user: it stays, and the loader refuses it as it refuses any user's.
"""

from __future__ import annotations

from typing import Any

from fleetrl.config.model_sections import DEFAULT_PROMPT, model_kinds_with, model_section

MOVED_KEYS = {  # an old key: where it went
    "env.action_chunk": "it is model.action_chunk now",
    "runner.checkpoint_replay_buffer": (
        "it is algorithm.checkpoint_replay_buffer now, a key of the algorithm that keeps a replay buffer"
    ),
    "model.aux_value_head": (
        "it was removed: the algorithm that trains an auxiliary value head adds the head to the policy itself"
    ),
    "rollout.backend": (
        "it was removed: nothing read it; a Hugging Face VLA acts through its own transformers model (model.id: hf)"
    ),
}

# Every key the schema of before the split wrote into config.yaml, with the default it wrote.
FLAT_MODEL_DEFAULTS: dict[str, Any] = {
    "id": "mlp",
    "kwargs": {},
    "hidden_sizes": [64, 64],
    "activation": "tanh",
    "shared_trunk": None,
    "init_log_std": 0.0,
    "ortho_init": True,
    "action_bins": None,
    "image_encoder": "auto",
    "embed_dim": 64,
    "num_layers": 2,
    "num_heads": 4,
    "patch_size": None,
    "keypoints": None,
    "critic_keys": [],
    "predict_keys": [],
    "predict_coef": 100.0,
    "path": None,
    "trust_remote_code": False,
    "prompt_template": DEFAULT_PROMPT,
    "action_chunk": 1,
    "decode": "parallel",
    "action_stats": None,
    "lora": None,
}
SAVED_SECTIONS: dict[str, dict[str, Any]] = {  # section: its old keys and defaults
    "model": FLAT_MODEL_DEFAULTS,
    "rollout": {"device": "cpu", "dtype": "auto", "backend": "hf", "pipeline_stage_num": 1},
}


def upgrade_saved_section(name: str, values: dict) -> dict:
    """`values` of section `name` as the loader should read it: unchanged unless it is a section
    saved before keys went (module docstring), whose retired keys at their old default are dropped.
    A key the kind still has but whose old default the new section no longer takes (`null` for
    `shared_trunk`, `action_bins` of a VLA) is dropped too when it holds that default: the new
    default means what the old null did."""
    old = SAVED_SECTIONS.get(name)
    if old is None or not set(old) <= set(values):
        return values
    keep = set(model_section(values.get("id", old["id"])).__dataclass_fields__) if name == "model" else set()
    if name == "rollout":
        keep = set(old) - {"backend"}
    return {
        key: value
        for key, value in values.items()
        if not (key in old and value == old[key] and (key not in keep or value is None))
    }


def retired_key_hint(prefix: str, key: str, values: dict) -> str:
    """What replaced `prefix.key`, or for a model key which kinds of model have it; '' if neither."""
    moved = MOVED_KEYS.get(f"{prefix}.{key}")
    if moved:
        return moved
    if prefix == "model":
        owners = model_kinds_with(key)
        if owners:
            return (
                f"{key!r} is a key of model.id {' and '.join(owners)}, not of {values.get('id', 'mlp')} (to change "
                "the kind of model on the command line, give the whole section: model={id: ..., key: value})"
            )
    return ""
