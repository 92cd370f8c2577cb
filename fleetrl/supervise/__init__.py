"""`fleetrl train`'s supervisor: attempts, restarts, the janitor, the controller's side of the link."""
