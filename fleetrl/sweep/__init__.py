"""`fleetrl sweep`: every combination of a grid of overrides, each a real `fleetrl train`, on Ray Tune.

grid.py plans and validates the trials (nothing starts before every combination has loaded),
trial.py runs one trial's `fleetrl train` from a Tune worker, driver.py runs the Tune experiment
and owns stopping, table.py turns the results into `sweep.md` and `curves.png`.
"""
