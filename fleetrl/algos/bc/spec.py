"""Registers the `bc` algorithm (the supervised stage, run by `fleetrl sft`): its section, its
workers by reference, and the rules that its demonstrations folder is a dataset with the features
it names (before a run starts, not when a finished run's config is read back) and of the env's
shapes (once they are known)."""

from __future__ import annotations

from fleetrl.algos.bc.config import BCConfig
from fleetrl.algos.registry import AlgorithmSpec, ConsoleMetric, register_algorithm
from fleetrl.config.schema import Config
from fleetrl.envs import demonstrations


def check_demonstrations(config: Config) -> None:
    """The demonstrations folder is a LeRobotDataset with the features the config names."""
    algo = config.algorithm
    demonstrations.check_folder(algo.demonstrations, algo.features, algo.action_feature)


def check_bc_spaces(config: Config, observation_space, action_space) -> None:
    """Every observation key of the env read from a feature of its shape, and the actions of its
    action space's (one env step's: the env worker's, whatever `model.action_chunk`)."""
    algo = config.algorithm
    demonstrations.check_spaces(
        algo.demonstrations, algo.features, algo.action_feature, algo.vf_coef, observation_space, action_space
    )


BC = register_algorithm(
    AlgorithmSpec(
        name="bc",
        config=BCConfig,
        actor="fleetrl.algos.bc.actor:BCActor",
        rollout="fleetrl.workers.rollout_worker:RolloutWorker",
        stage="sft",
        check_inputs=check_demonstrations,
        check_spaces=check_bc_spaces,
        console_metrics=(ConsoleMetric("bc_loss", "bc", ".3f"),),
    )
)
