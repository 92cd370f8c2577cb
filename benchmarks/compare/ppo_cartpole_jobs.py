"""One job of the PPO CartPole comparison (ppo_cartpole.py) per library: fleetrl to the target and
its evaluation, an SB3 job and a CleanRL job in their venvs, the bare PyTorch loop; and fleetrl's
collect / update throughput summed over its runs' iterations."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402
from kit import ROOT, log  # noqa: E402

HERE = Path(__file__).resolve().parent
RLZOO_CONFIG = HERE / "configs" / "ppo_cartpole_rlzoo.yaml"
SHIPPED_CONFIG = ROOT / "configs" / "ppo_cartpole.yaml"
# What a result keeps of each fleetrl iteration (the collect / update throughput is summed from them).
ITERATION_KEYS = (
    "iteration",
    "global_step",
    "episodes",
    "wall_s",
    "episode_return_last100",
    "time_collect_s",
    "time_update_s",
    "grad_steps",
)

# CleanRL ppo.py (cleanrl 1.2.0) flags for RL-Zoo's CartPole-v1 set. Not expressible in its flags:
# clip_range annealing (lin_0.2: clip stays 0.2) and bootstrapping at time-limit truncation.
CLEANRL_RLZOO_ARGS = [
    "--total-timesteps",
    "100000",
    "--learning-rate",
    "0.001",
    "--num-envs",
    "8",
    "--num-steps",
    "32",
    "--anneal-lr",
    "True",
    "--gamma",
    "0.98",
    "--gae-lambda",
    "0.8",
    "--num-minibatches",
    "1",
    "--update-epochs",
    "20",
    "--norm-adv",
    "True",
    "--clip-coef",
    "0.2",
    "--clip-vloss",
    "False",
    "--ent-coef",
    "0.0",
    "--vf-coef",
    "0.5",
    "--max-grad-norm",
    "0.5",
]
CLEANRL_COMMON_ARGS = ["--env-id", "CartPole-v1", "--cuda", "False", "--track", "False", "--capture-video", "False"]
CLEANRL_LINE = re.compile(r"global_step=(\d+), episodic_return=\[?\s*([-+0-9.eE]+)")


def fleetrl_bin(args) -> str:
    return kit.fleetrl_executable(args.fleetrl)


def source_digest() -> dict:
    """fleetrl is not pinned by a commit while it is developed: fingerprint what was benchmarked."""
    import hashlib

    digest = hashlib.sha256()
    files = sorted((ROOT / "fleetrl").rglob("*.py")) + [SHIPPED_CONFIG, RLZOO_CONFIG]
    for path in files:
        if path.exists():
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {"fleetrl_sources_sha256": digest.hexdigest()[:16], "git_head": head or None}


def run_fleetrl(args, comparison: str, config: Path, seed: int, workdir: Path) -> dict:
    """One fleetrl job to the target (`kit.train_to_target`), then `fleetrl eval` of the
    checkpoint it wrote at the stop."""
    source = source_digest()  # the fleetrl sources this job runs (they change while developed)
    job = kit.train_to_target(
        config,
        [f"runner.seed={seed}"],
        workdir / "fleetrl",
        f"{comparison}-s{seed}",
        args.target,
        args.job_timeout,
        executable=args.fleetrl,
    )
    result = {"library": "fleetrl", "comparison": comparison, "seed": seed, "config": str(config), "source": source}
    records = job.pop("records", [])
    result |= job
    if "error" in job:
        return result
    run_dir = Path(job["run_dir"])
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    threads = (resolved.get("runner") or {}).get("torch_threads")
    summary = job["summary"]
    result.update(
        torch_threads=threads if threads else "torch default",
        fleetrl_reported_startup_s=summary["startup_s"],
        fleetrl_reported_target_s=summary.get("target_reached_s"),
        total_env_steps=(resolved.get("runner") or {}).get("total_env_steps"),
        iterations=[{key: record.get(key) for key in ITERATION_KEYS} for record in records],
    )
    if job["target_reached"] and summary.get("target_reached_step") != job["steps_to_target"]:
        result["note"] = (
            f"summary target_reached_step {summary.get('target_reached_step')} != first metrics line "
            f"at/over target {job['steps_to_target']}"
        )
    # deterministic evaluation of the checkpoint written at stop
    eval_cmd = [fleetrl_bin(args), "eval", str(run_dir), "--episodes", str(args.eval_episodes), "--json"]
    started = time.time()
    done = subprocess.run(eval_cmd, capture_output=True, text=True, cwd=workdir)
    result["eval_process_wall_s"] = time.time() - started  # incl. interpreter start + imports
    result["eval_command"] = eval_cmd
    if done.returncode != 0:
        result["eval"] = None
        result["eval_error"] = f"fleetrl eval exited {done.returncode}: {done.stderr[-2000:]}"
    else:
        result["eval"] = json.loads(done.stdout)  # --json: the JSON alone on stdout
        result["eval_wall_s"] = result["eval"].get("eval_s")
    return result


def run_sb3(args, comparison: str, seed: int, workdir: Path) -> dict:
    job_args = ["--seed", str(seed), "--total-timesteps", "100000", "--target", str(args.target)]
    job_args += ["--eval-episodes", str(args.eval_episodes)]
    name = f"{comparison}-s{seed}"
    result = kit.library_job("sb3", HERE / "jobs" / "sb3_ppo.py", job_args, workdir / "sb3", name, args.job_timeout)
    result |= {"comparison": comparison, "seed": seed}
    if "error" not in result:
        result["eval_wall_s"] = result["eval"]["eval_s"] if result.get("eval") else None
    return result


def run_cleanrl(args, comparison: str, seed: int, ppo_args: list[str], workdir: Path) -> dict:
    python = kit.venv_python("cleanrl")
    cwd = workdir / "cleanrl" / f"{comparison}-s{seed}"  # its runs/ (tensorboard) folder goes here
    cwd.mkdir(parents=True, exist_ok=True)
    eval_out = cwd / "eval.json"
    eval_out.unlink(missing_ok=True)  # from an earlier attempt
    script_args = [*CLEANRL_COMMON_ARGS, "--seed", str(seed), *ppo_args]
    cmd = [
        str(python),
        "-u",
        str(HERE / "jobs" / "cleanrl_ppo.py"),
        "--out",
        str(eval_out),
        "--eval-episodes",
        str(args.eval_episodes),
        "--",
        *script_args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    returns: deque[float] = deque(maxlen=100)
    episodes, last_step = 0, 0
    t_ready, threads, cross = None, None, None
    timed_out = False
    with open(cwd / "stdout.log", "w") as tee, open(cwd / "stderr.log", "w") as errf:
        spawn = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, bufsize=1, cwd=cwd, env=env)
        deadline = spawn + args.job_timeout
        for line in proc.stdout:
            now = time.time()
            tee.write(line)
            if cross is None:
                match = CLEANRL_LINE.match(line)
                if match:
                    last_step = int(match.group(1))
                    returns.append(float(match.group(2)))
                    episodes += 1
                    if len(returns) == 100 and sum(returns) / 100 >= args.target:
                        cross = (last_step, now, sum(returns) / 100)
                        proc.send_signal(signal.SIGUSR1)  # -> evaluate the live agent, exit
                elif line.startswith("@@READY"):
                    _, stamp, nthreads = line.split()
                    t_ready, threads = float(stamp), int(nthreads)
            if now > deadline and proc.poll() is None:
                timed_out = True
                proc.kill()
        proc.wait()
        exit_time = time.time()
    result = {
        "library": "cleanrl",
        "comparison": comparison,
        "seed": seed,
        "command": cmd,
        "ppo_args": script_args,
        "returncode": proc.returncode,
        "workdir": str(cwd),
        "total_wall_s": exit_time - spawn,
        "torch_threads": threads,
        "target_return": args.target,
        "logged_episodes": episodes,
    }
    if t_ready is None or proc.returncode != 0 or timed_out:
        result["error"] = (
            f"cleanrl job exited {proc.returncode}{' (timed out)' if timed_out else ''}; see {cwd}/stderr.log"
        )
        log(result["error"])
    result["startup_s"] = (t_ready - spawn) if t_ready else None
    if cross is not None:
        step, seen, mean = cross
        result.update(
            target_reached=True, steps_to_target=step, train_s_to_target=seen - t_ready, last100_at_target=mean
        )
    else:
        result.update(
            target_reached=False,
            steps_to_target=None,
            train_s_to_target=None,
            train_s_total=(exit_time - t_ready) if t_ready else None,
        )
    result["last100_final"] = (sum(returns) / len(returns)) if returns else None
    result["global_step"] = last_step
    if eval_out.exists():
        job = json.loads(eval_out.read_text())
        result["eval"] = job.get("eval")
        result["eval_wall_s"] = job["eval"]["eval_s"] if job.get("eval") else None
        result["stopped_by"] = job.get("stopped_by")
        result["global_step_at_stop"] = job.get("global_step")
        result["ppo_path"] = job.get("ppo_path")
        if job.get("eval_error"):
            result["eval_error"] = job["eval_error"]
    else:
        result["eval"] = None
        result["eval_error"] = "no eval.json written"
    return result


def run_bare(args, threads: int) -> dict:
    cmd = [
        sys.executable,
        str(HERE / "bare_loop.py"),
        "--threads",
        str(threads),
        "--json",
        "--repeats",
        str(args.bare_repeats),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["requested_threads"] = threads or "torch default"
    return result


def fleetrl_throughput(jobs: list[dict], first_steps: int = 20_000) -> dict | None:
    """Aggregate collect / update throughput over the iterations of the given fleetrl runs."""
    totals = {"all": [0, 0.0, 0, 0.0], "early": [0, 0.0]}
    for job in jobs:
        previous = 0
        for record in job.get("iterations", []):
            steps = record["global_step"] - previous
            previous = record["global_step"]
            if record.get("time_collect_s") is None or record.get("time_update_s") is None:
                continue
            totals["all"][0] += steps
            totals["all"][1] += record["time_collect_s"]
            totals["all"][2] += record.get("grad_steps") or 0
            totals["all"][3] += record["time_update_s"]
            if record["global_step"] <= first_steps:
                totals["early"][0] += steps
                totals["early"][1] += record["time_collect_s"]
    steps, collect_s, grads, update_s = totals["all"]
    if not steps or not collect_s or not update_s:
        return None
    return {
        "runs": len(jobs),
        "env_steps": steps,
        "collect_s": collect_s,
        "grad_steps": grads,
        "update_s": update_s,
        "collect_steps_per_s": steps / collect_s,
        "collect_steps_per_s_first_20k": (totals["early"][0] / totals["early"][1] if totals["early"][1] else None),
        "update_grad_steps_per_s": grads / update_s,
        "update_samples_per_s": grads * 256 / update_s,
    }
