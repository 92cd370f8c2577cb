"""Config → a checked run plan (`resolve.resolve` → `run_plan.RunPlan`): the algorithm section
parsed with its registered spec, the rules that relate keys across sections, the placement and the
layout. Nothing here starts anything."""
