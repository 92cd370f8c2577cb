"""`algorithm.name` → the worker classes that implement it.

An algorithm supplies an actor worker class (constructed as `Actor(config, observation_space,
action_space, rank, world_size)`, with `train(trajectory_shard, progress) -> metrics`,
`policy_weights()`, `state_dict()`, `load_state_dict()`, `init_distributed(addr, port)` and a
`policy` attribute) and a rollout worker class (`Rollout(policy)` sharing the actor's policy in one
process, `Rollout.from_config(config, observation_space, action_space)` in its own). The
controller loop, placement and backends are the same for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetrl.errors import ConfigError


@dataclass(frozen=True)
class AlgorithmWorkers:
    actor: type
    rollout: type


def algorithm_workers(name: str) -> AlgorithmWorkers:
    if name == "ppo":
        from fleetrl.workers.actor_worker import ActorWorker
        from fleetrl.workers.rollout_worker import RolloutWorker

        return AlgorithmWorkers(ActorWorker, RolloutWorker)
    if name == "ppg":
        from fleetrl.workers.ppg_actor_worker import PPGActorWorker
        from fleetrl.workers.rollout_worker import RolloutWorker

        return AlgorithmWorkers(PPGActorWorker, RolloutWorker)
    if name == "sac":
        from fleetrl.workers.sac_actor_worker import SACActorWorker
        from fleetrl.workers.sac_rollout_worker import SACRolloutWorker

        return AlgorithmWorkers(SACActorWorker, SACRolloutWorker)
    raise ConfigError("algorithm.name", name, f"one of {list(ALGORITHMS)}")


ALGORITHMS = ("ppo", "ppg", "sac")
