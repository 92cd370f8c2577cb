"""From heartbeat records (and the errors that reach the controller) to a verdict: the incident
they show, naming the culprit, or None. Pure functions of what the watcher saw, on its own clock."""
