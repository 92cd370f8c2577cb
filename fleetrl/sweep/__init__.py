"""`fleetrl sweep`: every combination of a grid of overrides, each a real `fleetrl train`, on Ray Tune.

grid.py plans and validates the trials (nothing starts before every combination has loaded);
trial.py runs one trial's `fleetrl train` from a Tune worker, tied to it by lifetime.py;
driver.py runs the Tune experiment and owns stopping; outcome.py reads an ended trial's files;
table.py turns the records into `sweep.md` and `curves.png`.
"""
