"""The kit every benchmark script shares (`import kit` once benchmarks/ is on sys.path): running
`fleetrl train` and reading its run directory (runs), the load of other processes (load), the CPU a run's own processes keep busy (tree_cpu), the
libraries fleetrl is compared with (libraries), a base commit's tree beside this one (trees),
the machine a result ran on (describe), result cells and tables (tables), where things are
(places).

Not part of fleetrl; nothing here changes how fleetrl runs.
"""

from kit.describe import cpu_model, machine, machine_line, placement_threads
from kit.libraries import library_job, library_versions, venv_python, venv_versions
from kit.load import ForeignLoad, per_call_us, wait_for_quiet
from kit.places import (
    BENCH,
    RESULTS,
    ROOT,
    VENVS,
    fleetrl_executable,
    log,
    results_dir,
    subprocess_env,
    tiny_vla,
    write_json,
)
from kit.runs import (
    FIXED_WORK,
    TWO_ENV_NODES,
    collect_rate,
    first_at_target,
    read_run,
    run_fleetrl,
    run_interleaved,
    steady,
    train_log_times,
    train_to_target,
)
from kit.tables import cell, fmt, med, median, ratio, spread, throughput_table
from kit.trees import base_tree, before_after

__all__ = [
    "BENCH",
    "FIXED_WORK",
    "TWO_ENV_NODES",
    "RESULTS",
    "ROOT",
    "VENVS",
    "ForeignLoad",
    "base_tree",
    "before_after",
    "cell",
    "collect_rate",
    "cpu_model",
    "first_at_target",
    "fleetrl_executable",
    "fmt",
    "library_job",
    "library_versions",
    "log",
    "machine",
    "machine_line",
    "med",
    "median",
    "per_call_us",
    "placement_threads",
    "ratio",
    "read_run",
    "results_dir",
    "run_fleetrl",
    "run_interleaved",
    "spread",
    "steady",
    "subprocess_env",
    "tiny_vla",
    "throughput_table",
    "train_log_times",
    "train_to_target",
    "venv_python",
    "venv_versions",
    "wait_for_quiet",
    "write_json",
]
