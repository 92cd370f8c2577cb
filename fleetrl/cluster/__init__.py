"""Where the workers run, and how the controller reaches them.

`start.py` picks the plan's backend and starts it; `groups.py` holds the worker groups every
backend is called through (`group.call(rank, EnvWorker.step, ...)`).

- `backends/`: the three backends (`inline`, `ray`, `fused`) and `base.py`, what the controller
  sees of any of them.
- `exchange/`: how env and rollout workers swap actions and outcomes every step (`collect.py`, the
  queued calls; `compiled.py`, a Ray compiled graph; `direct.py`, worker-to-worker sockets).
- `ray/`: Ray plumbing: starting or joining an instance, the actor around each worker, node order.
- `isolation/`: simulated nodes in network namespaces of their own, and the bridge joining them.
"""
