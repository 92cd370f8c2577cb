"""Where a run's metrics, parameters, summary and incident report go: the trackers.

`base.Tracker` is the one interface; `trackers.Trackers` starts the ones `runner.loggers` names and
bounds every call to them, so that a tracker that fails or hangs costs one warning, never the run.
"""
