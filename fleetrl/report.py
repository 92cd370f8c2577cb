"""`fleetrl report`: PNG plots of a run's learning curve and where each iteration's time went."""

from __future__ import annotations

from pathlib import Path

from fleetrl.errors import UserError
from fleetrl.metrics_log import METRICS_FILE, read_metrics


def write_report(run_dir: Path) -> list[Path]:
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
    for key, label in (("episode_return_last100", "mean of last 100 episodes"),
                       ("episode_return_mean", "episodes of the iteration")):
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
    return paths


def _bar_width(steps: list[int]) -> float:
    return (steps[1] - steps[0]) * 0.9 if len(steps) > 1 else 1.0
