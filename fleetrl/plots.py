"""`fleetrl report`: PNG plots of a run's learning curve and where each iteration's time went; for
an env that reports `success` (docs: guides/manipulation.md), its success rates too."""

from __future__ import annotations

import json
from pathlib import Path

from fleetrl.errors import UserError
from fleetrl.tracking.jsonl import METRICS_FILE, read_metrics
from fleetrl.watch.reporting.hang_report import REPORT_JSON


def write_plots(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise UserError(f"{run_dir / METRICS_FILE} is missing or empty: nothing to plot")
    steps = [r["global_step"] for r in records]
    paths = [run_dir / "learning_curve.png", run_dir / "time_per_phase.png"]

    figure, axis = plt.subplots(figsize=(7, 4))
    for key, label in (
        ("episode_return_last100", "mean of last 100 episodes"),
        ("episode_return_mean", "episodes of the iteration"),
    ):
        points = [(s, r[key]) for s, r in zip(steps, records) if r.get(key) is not None]
        if points:
            axis.plot(*zip(*points), label=label)
    axis.set(xlabel="env steps", ylabel="episode return", title=f"learning curve — {run_dir.name}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(paths[0], dpi=100)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(7, 4))
    phases = sorted({key for r in records for key in r if key.startswith("time_")})
    bottom = [0.0] * len(records)
    for phase in phases:
        values = [r.get(phase) or 0.0 for r in records]
        axis.bar(steps, values, bottom=bottom, width=_bar_width(steps), label=phase[5:-2])
        bottom = [b + v for b, v in zip(bottom, values)]
    axis.set(xlabel="env steps", ylabel="seconds per iteration", title="time per phase")
    axis.legend()
    figure.tight_layout()
    figure.savefig(paths[1], dpi=100)
    plt.close(figure)
    if any("success_rate" in r or "eval_success_rate" in r for r in records):
        paths.append(draw_success_rates(run_dir, records, plt))
        if len(task_names(records)) > 1:
            paths.append(draw_success_per_task(run_dir, records, plt))
    if (run_dir / REPORT_JSON).is_file():
        paths.append(draw_incident_timeline(run_dir, plt))
    return paths


def draw_success_rates(run_dir: Path, records: list[dict], plt) -> Path:
    """success_rate.png: each iteration's training episodes (stochastic policy) and each
    evaluation (deterministic, at the env steps of the weights it evaluated), overall and per task."""
    figure, axis = plt.subplots(figsize=(7, 4))
    tasks = task_names(records)
    for prefix, step_key, style in (("", "global_step", "-"), ("eval_", "eval_global_step", "o-")):
        kind = "evaluation" if prefix else "training"
        for key, label, width in [("success_rate", "all tasks", 2.0)] + [
            (f"success_rate/{task}", task, 1.0) for task in tasks
        ]:
            points = [(r[step_key], r[prefix + key]) for r in records if r.get(prefix + key) is not None]
            if points:
                axis.plot(*zip(*points), style, linewidth=width, markersize=3, label=f"{kind}: {label}")
    axis.set(xlabel="env steps", ylabel="success rate", ylim=(-0.02, 1.02), title=f"success rate — {run_dir.name}")
    axis.legend(fontsize="small")
    figure.tight_layout()
    path = run_dir / "success_rate.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def task_names(records: list[dict]) -> list[str]:
    return sorted({key.split("/", 1)[1] for r in records for key in r if key.startswith("success_rate/")})


SMOOTHING = 10  # iterations in the training curve's moving mean: a task ends a few episodes an iteration


def draw_success_per_task(run_dir: Path, records: list[dict], plt) -> Path:
    """success_per_task.png: one panel per task (Meta-World's MT10: ten), its training success rate
    (the stochastic policy's episodes, a moving mean over `SMOOTHING` iterations that ended one)
    and its evaluations (deterministic) against env steps."""
    tasks = task_names(records)
    columns = min(5, len(tasks))
    rows = -(-len(tasks) // columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(3 * columns, 2.4 * rows), sharex=True, sharey=True, squeeze=False
    )
    for axis, task in zip(axes.flat, tasks):
        points = [(r["global_step"], r[f"success_rate/{task}"]) for r in records if f"success_rate/{task}" in r]
        if points:
            steps, rates = zip(*points)
            smooth = [
                sum(rates[max(0, i - SMOOTHING + 1) : i + 1]) / len(rates[max(0, i - SMOOTHING + 1) : i + 1])
                for i in range(len(rates))
            ]
            axis.plot(steps, smooth, ".-", linewidth=1.2, markersize=2, label="training")
        evaluated = [
            (r["eval_global_step"], r[f"eval_success_rate/{task}"]) for r in records if f"eval_success_rate/{task}" in r
        ]
        if evaluated:
            axis.plot(*zip(*evaluated), "o-", markersize=3, label="evaluation")
        axis.set_title(task, fontsize="small")
        axis.set_ylim(-0.02, 1.02)
    for axis in axes.flat[len(tasks) :]:
        axis.set_visible(False)
    axes.flat[0].legend(fontsize="x-small")
    figure.supxlabel("env steps")
    for axis in axes[:, 0]:
        axis.set_ylabel("success rate")
    figure.suptitle(f"success per task — {run_dir.name}", fontsize="medium")
    figure.tight_layout()
    path = run_dir / "success_per_task.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def draw_incident_timeline(run_dir: Path, plt) -> Path:
    """Which phase each worker was in during the last seconds before an incident."""
    report = json.loads((run_dir / REPORT_JSON).read_text())
    snapshots = report.get("timeline") or []
    workers = sorted({w for snap in snapshots for w in snap["phases"]})
    end = report["reported_at"]
    figure, axis = plt.subplots(figsize=(9, 1 + 0.5 * max(len(workers), 1)))
    colours: dict[str, str] = {}
    palette = plt.get_cmap("tab10")
    for row, worker in enumerate(workers):
        for (start, phase), (stop, _) in zip(_runs(snapshots, worker), _runs(snapshots, worker)[1:] + [(end, None)]):
            if phase:
                colour = colours.setdefault(phase, palette(len(colours) % 10))
                axis.broken_barh([(start - end, stop - start)], (row - 0.4, 0.8), color=colour)
    axis.axvline(report["incident_started"] - end, color="red", linestyle="--", label="incident began")
    for phase, colour in colours.items():
        axis.plot([], [], color=colour, linewidth=8, label=phase)
    axis.set(
        yticks=range(len(workers)),
        yticklabels=workers,
        xlabel="seconds before the report",
        title=f"{report['cause']}: phases before the incident",
    )
    axis.legend(loc="upper left", fontsize="small", ncol=3)
    figure.tight_layout()
    path = run_dir / "incident_timeline.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _runs(snapshots: list[dict], worker: str) -> list[tuple[float, str | None]]:
    """(start time, phase) each time the worker's phase changed."""
    runs: list[tuple[float, str | None]] = []
    for snap in snapshots:
        phase = snap["phases"].get(worker)
        if not runs or runs[-1][1] != phase:
            runs.append((snap["time"], phase))
    return runs


def _bar_width(steps: list[int]) -> float:
    return (steps[1] - steps[0]) * 0.9 if len(steps) > 1 else 1.0
