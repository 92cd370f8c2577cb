"""`fleetrl export RUN OUT`: a run's Hugging Face VLA as a standard folder.

The run's latest intact checkpoint is loaded into the policy its config describes (base folder
from `model.path`, the checkpoint's adapters or full weights on top — from the .pt, or from the
DCP shards of a sharded checkpoint, written by any number of actor ranks); with LoRA the adapters are
merged into the base weights (peft's `merge_and_unload`). OUT then holds what `save_pretrained`
writes — config.json, safetensors, the processor and tokenizer — which transformers'
`from_pretrained` loads anywhere, and `value_head.safetensors` (the critic, which transformers
ignores), so that `model.path: OUT` continues training where the run stopped; with a continuous
action head (`model.action_head` l1 or flow) also `action_head.safetensors`, the head's trained
tensors (the flow expert, the L1 regression head, the state's projection), and `action_head.json`,
what they mean (the head, its sizes, the chunk, the action bounds it normalises with, the state
key), loaded again from `model.path: OUT` with the same `action_head`. A policy built from OUT acts
as the run's did: the same distributions, the same actions from the same noise seed (to float32
rounding of the merged weights).
"""

from __future__ import annotations

from pathlib import Path

from fleetrl.checkpoint import load_latest
from fleetrl.errors import ConfigError, UserError
from fleetrl.models.hf.folder import VALUE_HEAD_FILE, copy_processor_files
from fleetrl.parallel import dcp
from fleetrl.plan.load import load_run_config
from fleetrl.probe.flight_recorder import phase
from fleetrl.run_dir import CONFIG_FILE


def export_run(run_dir: Path, out: Path) -> Path:
    from safetensors.torch import save_file

    from fleetrl.envs.make import make_vector_env
    from fleetrl.models.hf.lora import merged_model
    from fleetrl.models.policy import Policy

    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / CONFIG_FILE).is_file():
        raise UserError(f"{run_dir} is not a fleetrl run directory (no {CONFIG_FILE})")
    config = load_run_config(run_dir / CONFIG_FILE)
    if config.model.id != "hf":
        raise ConfigError("model.id", config.model.id, "'hf' in the run's config: only Hugging Face VLAs export")
    if (out / "config.json").exists():
        raise UserError(f"{out} holds a model already (config.json): choose an empty folder")
    state = load_latest(run_dir)
    env = make_vector_env(config.env, 1)
    try:
        spaces = env.single_observation_space, env.single_action_space
    finally:
        env.close()
    with phase("export"):
        policy = Policy.from_config(config.model, *spaces)
        if "shards_path" in state:  # actor.checkpoint_format: sharded: the shards read into this one copy
            dcp.load_model_weights(Path(state["shards_path"]), policy)
        else:
            policy.load_state_dict(state["actor"]["policy"])
        merged_model(policy.network).save_pretrained(out)
        copy_processor_files(Path(config.model.path).expanduser(), out)
        head = {name: tensor.contiguous() for name, tensor in policy.network.value_head.state_dict().items()}
        save_file(head, out / VALUE_HEAD_FILE)
        if hasattr(policy, "save_head"):  # a continuous action head (model.action_head l1, flow)
            policy.save_head(out, config.model)
    return out
