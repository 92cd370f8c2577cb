"""What runs inside every watched process: heartbeats, the flight recorder, recorded calls and
collectives, the heartbeat store and its client, stacks on request. Imports nothing of fleetrl above config."""
