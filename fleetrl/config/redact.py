"""Secrets from the environment stay off disk.

An environment variable whose name says it holds a secret — `WANDB_API_KEY`, `MLFLOW_TRACKING_
PASSWORD`, `RAY_AUTH_TOKEN`, fleetrl's own `FLEETRL_RUN_SECRET`, anything with KEY, TOKEN, SECRET,
PASSWORD or CREDENTIAL in its name — is a secret, and so is its value wherever it shows up. What
fleetrl writes into a run directory or hands to a tracker passes through here first: the saved
config and tracker parameters (`redacted`: a secret-named entry such as `cluster.env_vars.
WANDB_API_KEY`, and any text holding a secret value, replaced), log lines (`redact_text`, by a
filter on train.log and the console: run_dir.py) and reports.
"""

from __future__ import annotations

import os
import re

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MIN_SECRET_CHARS = 6  # shorter values ("1", "true") are flags, not secrets: replacing them would mangle text
REDACTED = "<redacted>"


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """The values of the secret-named variables of `environ` (this process's by default), longest
    first (a secret that contains another is replaced whole)."""
    environ = os.environ if environ is None else environ
    found = {value for name, value in environ.items() if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_CHARS}
    return sorted(found, key=len, reverse=True)


def redact_text(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every secret value replaced by `<redacted>`."""
    for secret in secret_values() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redacted(value, secrets: list[str] | None = None):
    """A copy of `value` (dicts, lists, strings, numbers) with the text of every secret-named
    variable (an upper-case key: config fields are lower-case, `max_new_tokens` is no secret), and
    every secret value inside text, replaced by `<redacted>`."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, dict):
        return {key: REDACTED if secret_entry(key, item) else redacted(item, secrets) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redacted(item, secrets) for item in value)
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


def secret_entry(name, value) -> bool:
    """An environment-variable-like entry (`WANDB_API_KEY: ...`) whose name says it is a secret."""
    return isinstance(name, str) and name.isupper() and bool(SECRET_NAME.search(name)) and isinstance(value, str)
