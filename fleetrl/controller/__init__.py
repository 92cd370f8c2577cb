"""The controller: the process that runs the training loop (`fleetrl train`'s supervisor starts it).

- `__main__.py`: the process itself, `python -m fleetrl.controller`, following its `Orders`
  (`orders.py`) from the supervisor: watched from its first instant, ended with its supervisor.
- `loop.py`: the training loop, `Trainer` — sync weights, collect, train, log, checkpoint — which
  a test or a library user may also run in its own process, watching itself.
"""
