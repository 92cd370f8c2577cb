"""From an incident to the hang report a person reads: `hang_report.txt` and `.json`, grouped at a
fleet's size, with the ranks' collectives aligned."""
