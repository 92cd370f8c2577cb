"""The markdown of the PPO CartPole comparison (ppo_cartpole.py): a table per comparison with the
ratios of medians, the throughput against the bare loop, and the other load while the jobs ran."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import ROOT, cell, fmt, med, ratio  # noqa: E402

LIB_NAMES = {"fleetrl": "fleetrl", "sb3": "SB3", "cleanrl": "CleanRL"}


def steps_or_inf(job: dict, key: str) -> float | None:
    if "error" in job and job.get(key) is None:
        return None
    return job[key] if job.get("target_reached") and job.get(key) is not None else math.inf


def eval_mean(job: dict):
    return job["eval"]["mean"] if job.get("eval") else None


def foreign(job: dict) -> float:
    return (job.get("load") or {}).get("foreign_cores", math.inf)


def is_clean(job: dict, max_foreign: float) -> bool:
    return "error" not in job and foreign(job) <= max_foreign


def comparison_table(title: str, rows: list[tuple[str, str, list[dict]]]) -> list[str]:
    lines = [
        f"#### {title}",
        "",
        "| library | config | torch threads | reached 475 | env steps to 475 | train s to 475 | "
        "start-up s | eval return (100 ep, deterministic) | eval s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    medians = {}
    for lib, config, jobs in rows:
        steps = [steps_or_inf(j, "steps_to_target") for j in jobs]
        secs = [steps_or_inf(j, "train_s_to_target") for j in jobs]
        startup = [j.get("startup_s") for j in jobs]
        evals = [eval_mean(j) for j in jobs]
        # each library's own timing of the evaluation (fleetrl: `fleetrl eval`'s eval_s, which
        # excludes that process's interpreter start; SB3 / CleanRL: timed in-process)
        eval_s = [(j.get("eval") or {}).get("eval_s") for j in jobs]
        threads = sorted({str(j.get("torch_threads")) for j in jobs})
        reached = sum(1 for j in jobs if j.get("target_reached"))
        medians[lib] = {
            "steps": med(steps),
            "secs": med(secs),
            "startup": med(startup),
            "eval": med(evals),
            "eval_s": med(eval_s),
        }
        dagger = "†" if any((j.get("load") or {}).get("contaminated") for j in jobs) else ""
        lines.append(
            f"| {LIB_NAMES[lib]} | {config} | {'/'.join(threads)} | {reached}/{len(jobs)} | "
            f"{cell(steps, thousands=True)} | {cell(secs, 2)}{dagger} | {cell(startup, 2)}{dagger} | "
            f"{cell(evals, 1)} | {cell(eval_s, 2)}{dagger} |"
        )
    if "fleetrl" in medians:
        for lib in medians:
            if lib == "fleetrl":
                continue
            f, o = medians["fleetrl"], medians[lib]
            lines.append(
                f"| **fleetrl / {LIB_NAMES[lib]}** (medians) | | | | "
                f"{ratio(f['steps'], o['steps'])} | {ratio(f['secs'], o['secs'])} | "
                f"{ratio(f['startup'], o['startup'])} | {ratio(f['eval'], o['eval'])} | "
                f"{ratio(f['eval_s'], o['eval_s'])} |"
            )
    lines.append("")
    return lines


def bare_loop_table(fleet: dict | None, bare: dict[str, dict]) -> list[str]:
    lines = [
        "#### Throughput: fleetrl vs a bare PyTorch loop (RL-Zoo config, 8 envs × 32 steps, minibatch 256 × 20 epochs)",
        "",
    ]
    if not bare:
        return lines + ["(bare loop skipped)", ""]
    keys = list(bare)
    header = (
        "| | "
        + (f"fleetrl ({fleet['runs']} runs, {fleet.get('torch_threads', '?')} thread(s)) | " if fleet else "")
        + " | ".join(f"bare loop, {bare[k]['torch_threads']} thread(s)" for k in keys)
    )
    if fleet:
        header += " | " + " | ".join(f"fleetrl / bare {bare[k]['torch_threads']}t" for k in keys)
    lines += [header + " |", "|" + "---|" * (1 + (1 if fleet else 0) + len(keys) * (2 if fleet else 1))]
    metrics = [
        ("collect, env steps/s (first 20k steps)", "collect_steps_per_s_first_20k", "collect_steps_per_s"),
        ("collect, env steps/s (whole runs)", "collect_steps_per_s", "collect_steps_per_s"),
        ("update, gradient steps/s", "update_grad_steps_per_s", "update_grad_steps_per_s"),
        ("update, samples/s", "update_samples_per_s", "update_samples_per_s"),
    ]
    for label, fkey, bkey in metrics:
        row = f"| {label} | "
        if fleet:
            row += f"{fmt(fleet.get(fkey), thousands=True)}{'†' if fleet.get('includes_contaminated_runs') else ''} | "
        row += " | ".join(
            fmt(bare[k][bkey], thousands=True) + ("†" if (bare[k].get("load") or {}).get("contaminated") else "")
            for k in keys
        )
        if fleet:
            row += " | " + " | ".join(ratio(fleet.get(fkey), bare[k][bkey]) for k in keys)
        lines.append(row + " |")
    lines.append("")
    return lines


def render_markdown(report: dict, max_foreign: float, out_path: Path) -> str:
    seeds, libs, comparisons = report["seeds"], report["libs"], report["comparisons"]
    target = report["target_return"]
    for job in report["jobs"] + list(report["bare"].values()):
        if job.get("load"):
            job["load"]["contaminated"] = foreign(job) > max_foreign

    def jobs_of(lib: str, comparison: str) -> list[dict]:
        if comparison == "b" and lib == "sb3" and "a" in comparisons:
            comparison = "a"
        return sorted(
            (j for j in report["jobs"] if j["library"] == lib and j["comparison"] == comparison),
            key=lambda j: j["seed"],
        )

    lines = [
        f"Seeds {', '.join(map(str, seeds))} ({len(seeds)} per library); target: mean return of the "
        f"last 100 training episodes ≥ {target:g}. Cells: median (min–max) over seeds; a seed that "
        "never reaches the target counts as +∞ in the median. Ratios: fleetrl median / other "
        "median (< 1: fleetrl needs fewer steps / less time). † = the cell includes at least one "
        f"run during which other processes on the machine used > {max_foreign:g} cores on average "
        "(its times are inflated; steps and returns are not affected).",
        "",
    ]
    cfg_a = {
        "fleetrl": "benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml",
        "sb3": "RL-Zoo CartPole-v1",
        "cleanrl": "ppo.py + RL-Zoo flags",
    }
    cfg_b = {
        "fleetrl": "configs/ppo_cartpole.yaml",
        "sb3": "RL-Zoo CartPole-v1 (= the (a) runs)",
        "cleanrl": "ppo.py defaults (500k steps)",
    }
    if "a" in comparisons:
        lines += comparison_table(
            "(a) Identical hyperparameters: RL-Zoo's tuned CartPole-v1 PPO set, 1e5-step schedule",
            [(lib, cfg_a[lib], jobs_of(lib, "a")) for lib in libs],
        )
    if "b" in comparisons:
        lines += comparison_table(
            "(b) Each library's own recommended CartPole-v1 config",
            [(lib, cfg_b[lib], jobs_of(lib, "b")) for lib in libs],
        )
    if report["bare"] or report.get("fleetrl_throughput"):
        lines += bare_loop_table(report.get("fleetrl_throughput"), report["bare"])
    everything = report["jobs"] + list(report["bare"].values())
    loads = [foreign(j) for j in everything if j.get("load")]
    dirty = [j for j in everything if j.get("load", {}).get("contaminated")]
    reruns = sum(j["load"].get("attempts", 1) - 1 for j in everything if j.get("load"))
    if loads:
        lines.append(
            f"Other processes' CPU load while the kept runs ran: median {statistics.median(loads):.2f}, "
            f"max {max(loads):.2f} cores (threshold {max_foreign:g}); {reruns} re-run(s) for "
            f"load; {len(dirty)} kept run(s) above the threshold."
        )
        lines.append("")
    shown = out_path.relative_to(ROOT) if out_path.is_relative_to(ROOT) else out_path
    lines.append(f"Raw per-seed results: {shown}")
    return "\n".join(lines)
