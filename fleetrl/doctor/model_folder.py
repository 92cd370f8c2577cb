"""The Hugging Face model folder (`model.id: hf`), checked as `fleetrl train --dry-run` checks it.

Only config.json, the processor and tokenizer files and the safetensors headers are read: no
weight, no model class (models/hf/folder.py `check_folder`). A folder of an unsupported family,
with code of its own and no `model.trust_remote_code`, without its processor or with truncated
weights is a FAIL naming the folder and what is wrong.
"""

from __future__ import annotations

from fleetrl.doctor.context import Context
from fleetrl.doctor.result import Check, failed, passed, skipped
from fleetrl.errors import ConfigError

NAME = "model_folder"


def check_model_folder(context: Context) -> list[Check]:
    model = context.config.model
    if model.id != "hf":
        return [skipped(NAME, f"model.id is {model.id!r}: no Hugging Face folder")]
    from fleetrl.models.hf.folder import check_folder

    try:
        folder, family = check_folder(model.path, model.trust_remote_code)
    except ConfigError as error:
        return [failed(NAME, str(error), "fix the folder or model.path (docs: guides/vla.md)")]
    return [passed(NAME, f"{folder}: the {family.name} family; config, processor and weight headers read")]
