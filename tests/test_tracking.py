"""The trackers of `runner.loggers`, each read back with its own tool: W&B in offline mode (its
`.wandb` run file, decoded as W&B's own records), MLflow in a local file store (MLflow's client).
A run sends the same metrics to both as to metrics.jsonl, the resolved config as parameters, the
summary at the end, and on an incident the hang report; a tracker that cannot work is one
warning and the run finishes."""

from __future__ import annotations

import json
import re
import socket
import struct
import time
from pathlib import Path

import pytest

from tests.support import REPO, Finished, train

SMALL = [
    "env.num_envs=4",
    "algorithm.num_steps=64",
    "algorithm.minibatch_size=64",
    "algorithm.update_epochs=1",
    "runner.total_env_steps=1024",
    "--skip-doctor",
]
WANDB_BLOCK = 32 * 1024  # the .wandb file: a 7-byte header, then records in LevelDB-log blocks


def train_tracked(tmp_path: Path, env: dict, *overrides: str) -> tuple[Finished, Path]:
    config = str(REPO / "configs" / "ppo_cartpole.yaml")
    result = train(config, *SMALL, *overrides, runs=tmp_path / "runs", cwd=tmp_path, env=env, timeout=240)
    assert result.run_dir is not None, result.stderr[-3000:]
    return result, result.run_dir


def tracker_env(tmp_path: Path) -> dict:
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(),
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 keeps the file store behind this switch
    }


def wandb_records(run_dir: Path) -> list:
    """Every record of the run's offline W&B file, as W&B's protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(raw):
        if WANDB_BLOCK - pos % WANDB_BLOCK < 7:  # a block's tail too short for a header is padding
            pos += WANDB_BLOCK - pos % WANDB_BLOCK
            continue
        _checksum, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        pending += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def of_kind(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def items(entries) -> dict:
    """W&B's key/value items (a key, or a nested key path) as a dict of decoded values."""
    return {entry.key or "/".join(entry.nested_key): json.loads(entry.value_json) for entry in entries}


@pytest.fixture
def file_store(monkeypatch):
    """This process reads the file store too."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def mlflow_run(tmp_path: Path, run_dir: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    return client, client.get_run(run_id)


@pytest.mark.usefixtures("file_store")
def test_wandb_offline_and_mlflow_file_store_hold_the_run(tmp_path):
    result, run_dir = train_tracked(tmp_path, tracker_env(tmp_path), "runner.loggers=[jsonl, wandb, mlflow]")
    result.succeeded()
    assert "tracker" not in result.stderr, result.stderr
    records, summary = result.metrics, result.summary
    steps = [r["global_step"] for r in records]
    assert steps == [256, 512, 768, 1024]
    assert not (run_dir / "tensorboard").exists()  # not named in runner.loggers

    wandb = wandb_records(run_dir)
    (run,) = of_kind(wandb, "run")
    assert run.display_name == run_dir.name and run.project == "fleetrl"
    config = items(run.config.update)
    assert config["runner"]["total_env_steps"] == 1024 and config["algorithm"]["num_steps"] == 64
    history = [items(h.item) for h in of_kind(wandb, "history")]
    assert [h["_step"] for h in history] == steps
    assert [h["policy_loss"] for h in history] == pytest.approx([r["policy_loss"] for r in records])
    summaries = {key: value for s in of_kind(wandb, "summary") for key, value in items(s.update).items()}
    assert summaries["global_step"] == summary["global_step"] == 1024
    assert [e.exit_code for e in of_kind(wandb, "exit")] == [0]

    client, run = mlflow_run(tmp_path, run_dir)
    assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"
    assert run.data.params["runner.total_env_steps"] == "1024" and run.data.params["algorithm.num_steps"] == "64"
    history = client.get_metric_history(run.info.run_id, "policy_loss")
    assert [m.step for m in history] == steps
    assert [m.value for m in history] == pytest.approx([r["policy_loss"] for r in records])
    local = Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path)))
    assert json.loads(local.read_text()) == summary


@pytest.mark.usefixtures("file_store")
def test_an_incident_attaches_the_hang_report(tmp_path):
    """The watchdog's path: env.step hangs, the watchdog's thread reports and ends the process
    (os._exit) — after the trackers attached the report and closed their runs as failed."""
    result, run_dir = train_tracked(
        tmp_path,
        tracker_env(tmp_path),
        "runner.loggers=[jsonl, wandb, mlflow]",
        "runner.total_env_steps=100000",
        "debug.fault={kind: hang, component: env, rank: 0, call: 100}",
        "watchdog.min_deadline_s=2",
    )
    assert result.code == 4, result.stderr[-3000:]
    report = (run_dir / "hang_report.txt").read_text()

    client, run = mlflow_run(tmp_path, run_dir)
    assert run.info.status == "FAILED"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"hang_report.txt", "hang_report.json"}
    assert Path(client.download_artifacts(run.info.run_id, "hang_report.txt", str(tmp_path))).read_text() == report

    wandb = wandb_records(run_dir)
    saved = {f.path for files in of_kind(wandb, "files") for f in files.files}
    assert {"hang_report.txt", "hang_report.json"} <= saved
    (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
    assert (wandb_dir / "files" / "hang_report.txt").read_text() == report
    assert [e.exit_code for e in of_kind(wandb, "exit")] == [1]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the socket is closed


def test_trackers_that_cannot_work_are_one_warning_each_and_the_run_finishes(tmp_path):
    """MLflow at a server that refuses connections (it would retry for minutes) and W&B online
    against one, with a key it cannot check: each is dropped after runner.tracker_timeout_s with
    one warning; jsonl and TensorBoard get everything; the run ends normally."""
    port = closed_port()
    env = {
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}",
        "WANDB_MODE": "online",
        "WANDB_BASE_URL": f"http://127.0.0.1:{port}",
        "WANDB_API_KEY": "x" * 40,
        "WANDB_SILENT": "true",
    }
    started = time.monotonic()
    result, run_dir = train_tracked(
        tmp_path, env, "runner.loggers=[jsonl, tensorboard, mlflow, wandb]", "runner.tracker_timeout_s=4"
    )
    result.succeeded()
    assert time.monotonic() - started < 90
    warnings = [line for line in result.stderr.splitlines() if "tracker" in line and "failed" in line]
    assert len(warnings) == 2, result.stderr
    for name, warning in zip(["mlflow", "wandb"], warnings):
        assert re.match(
            rf"\[fleetrl\] tracker {name} failed and is switched off, training goes on without it: start ", warning
        )
    assert [r["global_step"] for r in result.metrics] == [256, 512, 768, 1024]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert result.summary["global_step"] == 1024


FAKE_SECRETS = {"WANDB_API_KEY": "fake-wandb-key-0123456789abcdef", "MY_SECRET_TOKEN": "fake-token-9f8e7d6c5b4a"}


@pytest.mark.usefixtures("file_store")
def test_no_secret_from_the_environment_reaches_disk_and_wandb_dir_is_honoured(tmp_path):
    """Secrets in the environment (and one also given to the workers through cluster.env_vars)
    are in no file of the run directory — config.yaml, train.log, the trackers' files — nor in
    the trackers' parameters; W&B writes where WANDB_DIR says."""
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    env = tracker_env(tmp_path) | FAKE_SECRETS | {"WANDB_DIR": str(wandb_dir)}
    given = f"cluster.env_vars={{MY_SECRET_TOKEN: {FAKE_SECRETS['MY_SECRET_TOKEN']}}}"
    result, run_dir = train_tracked(tmp_path, env, "runner.loggers=[jsonl, wandb, mlflow]", given)
    result.succeeded()
    assert not (run_dir / "wandb").exists() and list(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    written = [path for folder in (run_dir, wandb_dir, tmp_path / "mlruns") for path in folder.rglob("*")]
    files = [path for path in written if path.is_file()]
    assert run_dir / "config.yaml" in files and run_dir / "train.log" in files
    for path in files:
        data = path.read_bytes()
        assert not any(secret.encode() in data for secret in FAKE_SECRETS.values()), path
    assert "MY_SECRET_TOKEN: <redacted>" in (run_dir / "config.yaml").read_text()
    _, run = mlflow_run(tmp_path, run_dir)
    assert run.data.params["cluster.env_vars"] == "{'MY_SECRET_TOKEN': '<redacted>'}"
