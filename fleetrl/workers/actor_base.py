"""What every algorithm's actor worker is to the controller, and what every actor has.

The controller (runner, runtime, fused ranks) names the interface's methods through this class
(`actor.call_all(ActorBase.verify_replicas)`), never by string, so a reader and an IDE follow a
call to its definition, and an algorithm's actor is checked against this interface when its
group is built.

What every actor has lives here, once: the rank check (the layout and space rules of its
algorithm ran in the plan, plan/rules.py, before any actor is built), the device, identical initial weights (seeded from
`runner.seed`), joining and leaving the actor ranks' process group, starting every rank from rank
0's replicated modules, the sum over ranks, and the replica checks (one fingerprint all-gather
over `replicated_modules`). An algorithm supplies its modules, how it wraps them for several
ranks (`wrap_for_ranks`), `train` and its checkpoint state.

Collective methods with several ranks — every rank must call them, in the same order:
`init_distributed`, `train`, `replica_divergence`, `verify_replicas`, and for sharded actors
`policy_weights`, `state_dict`, `load_state_dict`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

import gymnasium as gym
import torch

from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError
from fleetrl.parallel import process_group, reduce, seeds, state
from fleetrl.parallel.param_check import ReplicaDivergenceError, divergent_replicas
from fleetrl.parallel.sync_group import SyncMember
from fleetrl.parallel.sync_payload import Header, encode
from fleetrl.trajectory import Trajectory

log = logging.getLogger("fleetrl")


# The buffers `model.standardize_inputs` adds to each vector input (models/transformer.py VectorToken)
STATISTICS = (".mean", ".std")
NAMED = 3  # keys named of each kind, the rest counted


def weights_mismatch(expected: dict[str, tuple], given: dict[str, tuple]) -> str:
    """What tells weights `given` (state_dict key → shape) from the model's (`expected`): the keys
    missing and the keys unexpected, or else the tensors of other shapes, a few named; where the only
    difference is the input statistics, the setting that tells the two models apart; '' where keys
    and shapes agree."""
    missing, unexpected = sorted(expected.keys() - given.keys()), sorted(given.keys() - expected.keys())
    if not missing and not unexpected:
        shaped = [key for key in sorted(expected) if tuple(expected[key]) != tuple(given[key])]
        if not shaped:  # the same keys and shapes: torch's own message says what else differs
            return ""
        named = [f"{key}: {list(given[key])}, here {list(expected[key])}" for key in shaped]
        return f"{len(shaped)} of its tensors have other shapes ({first_few(named)})"
    parts = [
        f"{len(keys)} {what} ({first_few(keys)})"
        for what, keys in (("missing", missing), ("unexpected", unexpected))
        if keys
    ]
    text = "its weights have " + " and ".join(parts) + " keys"
    if missing and not unexpected and all(key.endswith(STATISTICS) for key in missing):
        text += (
            ": the input statistics; it was trained without model.standardize_inputs, "
            "so set model.standardize_inputs=false here or start from a run that had it"
        )
    elif unexpected and not missing and all(key.endswith(STATISTICS) for key in unexpected):
        text += ": the input statistics; it was trained with model.standardize_inputs, so set it true here"
    return text


def first_few(items: list[str]) -> str:
    """The first `NAMED` of `items`, then '...' where there are more."""
    return ", ".join(items[:NAMED]) + (", ..." if len(items) > NAMED else "")


def shapes(weights: dict) -> dict[str, tuple]:
    """A state_dict's key → shape (a sharded tensor's whole shape)."""
    return {key: tuple(getattr(value, "shape", ())) for key, value in weights.items()}


def actor_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class ActorBase(SyncMember, ABC):
    """One rank of an algorithm's actor: constructed as
    `Actor(config, observation_space, action_space, rank, world_size)`. Rank 0 is a member of the
    weight-sync group where the run has one (`SyncMember`, parallel/sync_group.py)."""

    policy: torch.nn.Module  # what a rollout worker in the same process acts with
    config: Config
    rank: int
    world_size: int
    device: torch.device
    distributed: bool  # joined the group and wrapped (several ranks)
    owns_process_group: bool  # this worker created the group, and destroys it in `close`

    def __init__(
        self, config: Config, observation_space: gym.Space, action_space: gym.Space, rank: int = 0, world_size: int = 1
    ):
        """Checks the rank, picks the device and seeds
        torch from `runner.seed`, so the modules a subclass builds next are identical on every
        rank wherever it is built."""
        if not 0 <= rank < world_size:
            raise ValueError(f"actor rank {rank} is outside the world size {world_size}")
        self.config, self.rank, self.world_size = config, rank, world_size
        self.device = actor_device(config.actor.device)
        self.distributed = False
        self.owns_process_group = False
        self.outgoing = None  # rank 0: the encoded weights `prepare_weights` made for `send_weights`
        torch.manual_seed(config.runner.seed)  # identical initial weights wherever it is built

    # ---------------------------------------------------------------------------- distribution

    def init_distributed(self, master_addr: str, master_port: int) -> None:
        """Join the actor ranks' process group (rendezvous on rank 0's node at
        master_addr:master_port, every wait bounded by `actor.dist_timeout_s`), make every
        replicated module rank 0's, and wrap the loss paths (`wrap_for_ranks`). Call on all ranks
        together, right after construction. With one rank it does nothing. A process that is
        already in a group of this world size (e.g. a test driving several workers) reuses it."""
        if self.world_size == 1 or self.distributed:
            return
        self.owns_process_group = process_group.join_process_group(
            self.rank, self.world_size, master_addr, master_port, self.config.actor.dist_timeout_s, self.device
        )
        # Same seed, same code: the weights should already agree. If they do not, the model's
        # initialisation draws from an unseeded source; say so, then use rank 0's everywhere.
        differing = divergent_replicas(self.replicated_modules())
        if differing and self.rank == 0:
            log.warning(
                "initial weights differ across the %d actor ranks in %s: the model's initialisation "
                "is not deterministic; every rank starts from rank 0's",
                self.world_size,
                sorted(differing),
            )
        for module in self.replicated_modules().values():
            reduce.broadcast_module_(module)
        self.wrap_for_ranks()
        self.distributed = True

    @abstractmethod
    def wrap_for_ranks(self) -> None:
        """Wrap the loss paths for several ranks (DDP, FSDP), once the group is joined and the
        replicas agree."""

    def require_distributed(self) -> None:
        """Training with several ranks before `init_distributed` would desynchronise them."""
        if self.world_size > 1 and not self.distributed:
            raise RuntimeError(f"{type(self).__name__}.train with several ranks needs init_distributed first")

    def close(self) -> None:
        """Leave the weight-sync group, and the process group if this worker created it."""
        self.leave_weight_sync()
        if self.owns_process_group:
            process_group.destroy_process_group()
            self.owns_process_group = False

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over actor ranks (identity with one). Moves to the backend's device and back."""
        if self.world_size == 1:
            return tensor
        device = reduce.comm_device()
        return reduce.all_reduce_sum(tensor.to(device)).to(tensor.device)

    # ------------------------------------------------------------------------------- replicas

    @abstractmethod
    def replicated_modules(self) -> dict[str, torch.nn.Module]:
        """Every module whose parameters and buffers must be identical on all ranks, by name
        (target networks included)."""

    @property
    def sharded(self) -> bool:
        """Parameters are shards (FSDP): they differ across ranks by design, and state getters
        and setters are collective."""
        return False

    def replica_divergence(self) -> dict[str, list[int]]:
        """{'<module>.<tensor>': odd ranks} for every parameter or buffer of `replicated_modules`
        whose value is not the same on all ranks; {} when they agree, with one rank, and when
        sharded. Collective otherwise: one all-gather of a fingerprint (64-bit hash of the exact
        bits) per tensor."""
        if self.world_size == 1 or self.sharded:
            return {}
        return divergent_replicas(self.replicated_modules())

    def verify_replicas(self) -> None:
        """Raise `ReplicaDivergenceError` (naming the tensors and ranks) when the ranks'
        replicated tensors differ. Every rank gets the same answer, so all ranks raise together."""
        differing = self.replica_divergence()
        if differing:
            raise ReplicaDivergenceError(differing, self.world_size)

    # ------------------------------------------------------------------- training and state

    @abstractmethod
    def train(self, trajectory: Trajectory, progress: float) -> dict:
        """Train on this rank's shard of one iteration's trajectory; metrics reduced over ranks."""

    @abstractmethod
    def policy_weights(self):
        """What the rollout workers load (`RolloutWorker.load_weights`)."""

    @abstractmethod
    def state_dict(self) -> dict:
        """The full actor state in the single-process layout (complete on rank 0)."""

    def random_state(self) -> dict:
        """This rank's process's random state (its minibatch shuffles), for the checkpoint."""
        return seeds.random_state()

    def load_random_state(self, state: dict) -> None:
        seeds.set_random_state(state)

    def load_policy_weights(self, weights: dict) -> None:
        """Start from another run's policy weights (`runner.init_from`: a supervised stage's),
        keeping this run's fresh optimizer and counters. Every rank is given the full weights
        (collective under FSDP). Weights of another model are a `ConfigError` on runner.init_from."""
        try:
            state.load_model_state(self.policy, weights, self.sharded)
        except (RuntimeError, KeyError) as error:
            raise ConfigError(
                "runner.init_from",
                self.config.runner.init_from,
                "a checkpoint of this run's model (same model and observation and action spaces)",
                weights_mismatch(shapes(self.policy.state_dict()), shapes(weights)) or str(error).splitlines()[0],
            ) from None

    @abstractmethod
    def load_state_dict(self, saved: dict) -> None:
        """Load a state written by `state_dict` (any strategy and rank count), or by
        `save_sharded` (then `saved['shards_path']` names the shards' folder)."""

    def trainable_weights(self) -> dict:
        """Only what training changes, for the rollout workers' `load_patch`
        (`runner.weight_sync: trainable`); collective under FSDP like `policy_weights`."""
        raise NotImplementedError(f"{type(self).__name__} sends no partial weights")

    def changed_weights(self) -> dict:
        """The first time the full weights, then only the values that changed at the rollout's
        precision, for the rollout workers' `load_changed` (`runner.weight_sync: changed`)."""
        raise NotImplementedError(f"{type(self).__name__} sends no changed values")

    def prepare_weights(self, kind: str) -> Header | None:
        """The weights of sync `kind` (`runner.weight_sync`: full, trainable or changed — gathered by
        `SYNC_GATHERS[kind]`) encoded for the weight-sync group (parallel/sync_payload.py): rank 0
        keeps the bytes for `send_weights` and returns their header, for the rollout workers'
        `receive_weights`; the other ranks None. Collective under FSDP, like the gathers."""
        if self.rank != 0 and not self.sharded:
            return None  # rank 0's weights are the ones sent; the others need not gather
        payload = getattr(self, SYNC_GATHERS[kind].__name__)()
        if self.rank != 0:
            return None
        header, self.outgoing = encode(kind, payload)
        return header

    def send_weights(self) -> None:
        """Rank 0: broadcast the bytes `prepare_weights` kept to every rollout worker (collective
        with their `receive_weights`)."""
        buffer, self.outgoing = self.outgoing, None
        if buffer is None or self.sync_group is None:
            raise RuntimeError("send_weights needs the weight-sync group and a prepare_weights before it")
        self.sync_group.broadcast(buffer, buffer.nbytes)

    def save_sharded(self, folder: str) -> dict:
        """Write this rank's shards of the trainable state into `folder` (collective:
        `actor.checkpoint_format: sharded`); return the rest of the state (complete on rank 0)."""
        raise NotImplementedError(f"{type(self).__name__} writes no sharded checkpoints")


# What the actor gathers for each `runner.weight_sync` kind, whichever transport carries it (the
# rollout's loader of each: rollout_worker.SYNC_LOADS). Called by name: an algorithm's override runs.
SYNC_GATHERS = {
    "full": ActorBase.policy_weights,
    "trainable": ActorBase.trainable_weights,
    "changed": ActorBase.changed_weights,
}
