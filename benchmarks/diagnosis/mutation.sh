#!/usr/bin/env bash
# Mutation testing of the modules that decide what an incident is and how a run ends: judgement,
# alignment, classification, the checks (verdict), the watchdog loop, the incident response and
# checkpoint integrity (pyproject.toml's [tool.mutmut] names them and the exact, in-process tests
# each mutant is run against). A mutant that no selected test fails on survives; the score is
# (killed + timed out) / the mutants run. The record, per module (each module's sha256, its
# counts, every mutant not killed by name): docs/benchmarks/mutation.json, shown and explained
# on docs/benchmarks/mutation.md.
# Not part of CI (CPU-heavy: hours for the ~2,250 mutants on the loaded 2-core host): run it from
# the repository root with the `mutation` extra installed,
#   pip install -e '.[test,mutation]' && benchmarks/diagnosis/mutation.sh [children]
# `children` (default 2): mutants run at once. The selected tests read no CPU shares and no
# clocks' speed, so a loaded host changes the time, not the verdicts. A stopped run goes on where
# it stopped with `mutmut run` in the same tree (this script starts afresh: it removes mutants/).
# It prints mutmut's per-mutant results (survivors by name: `mutmut show <name>` shows the
# change) and then the table of scores.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
MUTMUT=${MUTMUT:-.venv/bin/mutmut}
rm -rf mutants
# non-zero: survivors, or a failed clean run of the selected tests (shown above)
nice -n 10 "$MUTMUT" run --max-children "${1:-2}" || true
"$MUTMUT" results --all true > mutants/results.txt
grep -v ": killed$" mutants/results.txt || true
.venv/bin/python benchmarks/diagnosis/mutation_results.py mutants/results.txt
