"""The sweep's results per setting (a combination without the seed): `sweep.md` and `curves.png`.

Each statistic is the median over the setting's finished seeds with its spread (min–max); steps
and seconds to `runner.target_return` over the seeds that reached it, counted. Failed and stopped
trials are listed under the table, never averaged in.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from fleetrl.sweep.outcome import learning_curve

TABLE_FILE = "sweep.md"
PLOT_FILE = "curves.png"
COLUMNS = (
    ("final return(100)", "final_return", "{:.1f}"),
    ("best return(100)", "best_return", "{:.1f}"),
    ("steps to target", "target_step", "{:,.0f}"),
    ("seconds to target", "target_s", "{:.1f}"),
)


def by_setting(records: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record["setting"], []).append(record)
    return groups


def spread(values: list[float], form: str) -> str:
    """'median [min–max]' of the values, or '—' when there are none."""
    if not values:
        return "—"
    median = form.format(statistics.median(values))
    return median if len(values) == 1 else f"{median} [{form.format(min(values))}–{form.format(max(values))}]"


def table_text(records: list[dict], title: str) -> str:
    lines = [
        f"# {title}",
        "",
        "| setting | seeds finished | " + " | ".join(label for label, _, _ in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for setting, group in by_setting(records).items():
        finished = [r for r in group if r["status"] == "finished"]
        cells = []
        for _, key, form in COLUMNS:
            values = [r[key] for r in finished if r.get(key) is not None]
            cell = spread(values, form)
            if key.startswith("target") and finished:
                cell += f" ({len(values)}/{len(finished)} reached)"
            cells.append(cell)
        lines.append(f"| {setting} | {len(finished)}/{len(group)} | " + " | ".join(cells) + " |")
    unfinished = [r for r in records if r["status"] != "finished"]
    if unfinished:
        lines += ["", "Not finished:", ""]
        lines += [f"- {describe(r)}" for r in unfinished]
    return "\n".join(lines) + "\n"


def describe(record: dict) -> str:
    """One line: which trial, what it tried, what became of it."""
    overrides = " ".join(f"{key}={value}" for key, value in record["overrides"].items())
    text = f"{record['trial']} ({overrides}): {record['status']}"
    if record["status"] == "failed":
        text += f", exit code {record['exit_code']}: {record['cause']}"
        if record.get("hang_report"):
            text += f" (report: {record['hang_report']})"
    return text


def write_table(records: list[dict], sweep_dir: Path) -> str:
    text = table_text(records, sweep_dir.name)
    (sweep_dir / TABLE_FILE).write_text(text)
    return text


def write_curves(records: list[dict], sweep_dir: Path) -> Path:
    """Per setting, the median over its finished seeds' last-100 return against env steps, with
    a min–max band. A seed that stopped early (target reached) counts up to its last step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for setting, group in by_setting(records).items():
        curves = [c for c in (learning_curve(r) for r in group if r["status"] == "finished") if c]
        if not curves:
            continue
        steps = np.array(sorted({step for c in curves for step, _ in c}), dtype=float)
        stacked = np.full((len(curves), len(steps)), np.nan)
        for row, points in enumerate(curves):
            x, y = np.array(points, dtype=float).T
            inside = (steps >= x[0]) & (steps <= x[-1])
            stacked[row, inside] = np.interp(steps[inside], x, y)
        known = ~np.all(np.isnan(stacked), axis=0)
        steps, stacked = steps[known], stacked[:, known]
        (line,) = axis.plot(steps, np.nanmedian(stacked, axis=0), label=f"{setting} ({len(curves)} seeds)")
        axis.fill_between(
            steps, np.nanmin(stacked, axis=0), np.nanmax(stacked, axis=0), color=line.get_color(), alpha=0.2
        )
    axis.set(
        xlabel="env steps", ylabel="return (mean of last 100 episodes)", title=f"{sweep_dir.name}: median, min–max"
    )
    if axis.lines:
        axis.legend(fontsize="small")
    figure.tight_layout()
    path = sweep_dir / PLOT_FILE
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
