#!/usr/bin/env bash
# Mutation testing of the diagnosis core: watch/ judgement, alignment and classification
# (pyproject.toml's [tool.mutmut] names the modules and the fast in-process tests each mutant is
# run against). A mutant that no selected test fails on survives; the score is killed / all.
# Not part of CI (CPU-heavy): run it from the repository root with the `mutation` extra installed,
#   pip install -e '.[test,mutation]' && benchmarks/mutation.sh
# It prints mutmut's per-mutant results (survivors by name: `mutmut show <name>` shows the
# change) and then the score.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf mutants
# mutmut first runs the selected tests unmutated and stops if they fail: their judgements read a
# thread's CPU share, so run this on a host that is not saturated (a thread given 2% of a core is,
# correctly, judged blocked rather than busy).
nice -n 10 .venv/bin/mutmut run --max-children 1 || true  # non-zero: survivors (or a failed clean run, shown above)
.venv/bin/mutmut results --all true > mutants/results.txt
.venv/bin/mutmut export-cicd-stats
cat mutants/results.txt
python3 - <<'SCORE'
import json

stats = json.load(open("mutants/mutmut-cicd-stats.json"))
checked = stats["total"] - stats["skipped"]
print(f"killed {stats['killed']} of {checked} mutants: {100 * stats['killed'] / max(checked, 1):.1f} %")
print(json.dumps(stats))
SCORE
