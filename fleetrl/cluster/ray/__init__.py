"""Ray plumbing: the run's own instance (or a joined cluster), the actor around each worker, the
workers' import paths, and fleetrl's names for Ray's nodes."""
