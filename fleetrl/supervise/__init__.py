"""`fleetrl train`'s supervisor (supervisor.py): one attempt per controller process it starts
(attempt.py), where that controller's heartbeat store listens (store_address.py), when it restarts
one (restarts.py), and the janitor that leaves nothing behind even when the supervisor is killed
(janitor.py). Of fleetrl.watch it sees one module, its watch over the controller
(watch/supervision.py)."""
