"""Live tools for a running job: `fleetrl top` and `fleetrl stack`."""
