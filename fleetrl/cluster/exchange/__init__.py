"""The env ⇄ rollout exchange: how actions and outcomes travel between env and rollout workers
every step (`cluster.exchange`)."""
