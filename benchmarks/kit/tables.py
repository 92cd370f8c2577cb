"""Result cells and tables: medians, spreads, ratios, and the throughput table of interleaved
runs."""

from __future__ import annotations

import math
import statistics


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values) -> str:
    values = list(values)
    if not values:
        return "–"
    return f"{min(values):.3g}–{max(values):.3g}"


def med(values: list) -> float | None:
    """The median of the values that are not None (None if there are none)."""
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def fmt(value, digits: int = 1, thousands: bool = False) -> str:
    """A result cell: n/a for None, 'not reached' for infinity."""
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "not reached"
    return f"{value:,.0f}" if thousands else f"{value:.{digits}f}"


def cell(values: list, digits: int = 1, thousands: bool = False) -> str:
    """'median (min–max)' of the values that are not None."""
    clean = [v for v in values if v is not None]
    if not clean:
        return "n/a"
    text = fmt(statistics.median(clean), digits, thousands)
    if len(clean) > 1:
        text += f" ({fmt(min(clean), digits, thousands)}–{fmt(max(clean), digits, thousands)})"
    return text


def ratio(a, b) -> str:
    if a is None or b is None or math.isinf(a) or math.isinf(b) or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


def throughput_table(
    runs: dict[str, list[dict]], threads: dict[str, str], baseline: str, extra_columns: dict | None = None
) -> str:
    """Markdown: throughput (median, range, ratio to `baseline`) and per-phase medians."""
    extra_columns = extra_columns or {}
    ok = {name: [r for r in rs if r["code"] == 0] for name, rs in runs.items()}
    base = median(r["steady"]["steps_per_s"] for r in ok[baseline])
    head = [
        "variant",
        "runs ok",
        "env steps/s median (range)",
        f"vs {baseline}",
        "collect s/iter",
        "update s/iter",
        "weight sync s/iter",
        *extra_columns,
        "start-up s (median)",
        "end-to-end wall s",
        "other load, cores",
        "torch threads",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rs in ok.items():
        if not rs:
            lines.append(f"| {name} | 0/{len(runs[name])} |" + " – |" * (len(head) - 2))
            continue
        sps = [r["steady"]["steps_per_s"] for r in rs]
        cells = [
            name,
            f"{len(rs)}/{len(runs[name])}",
            f"{median(sps):.0f} ({spread(sps)})",
            f"{median(sps) / base:.2f}×",
            f"{median(r['steady']['collect_s'] for r in rs):.3f}",
            f"{median(r['steady']['update_s'] for r in rs):.3f}",
            f"{median(r['steady']['sync_s'] for r in rs):.4f}",
            *[fn(rs) for fn in extra_columns.values()],
            f"{median(r['summary']['startup_s'] for r in rs):.1f}",
            f"{median(r['wall_s'] for r in rs):.1f}",
            f"{median(r['foreign_cores'] for r in rs):.2f}",
            threads.get(name, "?"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
