#!/usr/bin/env bash
# Mutation testing of the diagnosis core: watch/ judgement, alignment and classification
# (pyproject.toml's [tool.mutmut] names the modules and the exact, in-process tests each mutant is
# run against: tests/test_judgement_rules.py, test_alignment_rules.py, test_classify.py). A
# mutant that no selected test fails on survives; the score is (killed + timed out) / all, as
# mutmut's own badge counts it. The latest score and every survivor's fate:
# docs/benchmarks/mutation.md.
# Not part of CI (CPU-heavy: 32 min for 1,089 mutants on the loaded 2-core host): run it from the repository root with the
# `mutation` extra installed,
#   pip install -e '.[test,mutation]' && benchmarks/diagnosis/mutation.sh [children]
# `children` (default 2): mutants run at once. The selected tests read no CPU shares and no
# clocks' speed, so a loaded host changes the time, not the verdicts.
# It prints mutmut's per-mutant results (survivors by name: `mutmut show <name>` shows the
# change) and then the score.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
MUTMUT=${MUTMUT:-.venv/bin/mutmut}
rm -rf mutants
# non-zero: survivors, or a failed clean run of the selected tests (shown above)
nice -n 10 "$MUTMUT" run --max-children "${1:-2}" || true
"$MUTMUT" results --all true > mutants/results.txt
"$MUTMUT" export-cicd-stats
grep -v ": killed$" mutants/results.txt || true
python3 - <<'SCORE'
import json

stats = json.load(open("mutants/mutmut-cicd-stats.json"))
checked = stats["total"] - stats["skipped"]
caught = stats["killed"] + stats["timeout"]
print(f"killed {caught} of {checked} mutants ({stats['timeout']} of them by a timeout): {100 * caught / max(checked, 1):.1f} %")
print(json.dumps(stats))
SCORE
