"""The backends: where the env, rollout and actor workers run (`cluster.backend`). `base.py` is
what the controller sees of any of them."""
