"""`algorithm.name` → the algorithm's registered spec: its config section, workers, rules, console.

An algorithm plugs in by calling `register_algorithm(AlgorithmSpec(...))` from its own module;
nothing else in the package names it. An installed package makes its algorithm available to
`fleetrl train` (and to every worker process) by an entry point in the `fleetrl.algorithms` group,
named like the algorithm: `reinforce = my_package.algos:SPEC` — loaded when the name is first
asked for. The controller loop, placement and backends are the same
for every algorithm: they build `spec.actor_class()(config, observation_space, action_space,
rank, world_size)` (an `ActorBase`) and `spec.rollout_class()(actor.policy)` in one process or
`spec.rollout_class().from_config(config, observation_space, action_space)` in its own, and the
loader builds the `algorithm` section as `spec.config` (through `SECTIONS`, from plan/load.py).

The built-in algorithms are the packages of `fleetrl/algos/` (but `common`), each named like its
algorithm and registering it from its `spec` module, which this module imports on first use
(`builtin_names`): adding one is adding its package, and this module names none of them. A
built-in's spec names its worker classes by reference ('module:Class'), so reading and checking a
config — all that `fleetrl train`'s supervisor, the doctor and a dry run do — imports neither
torch nor the models; the processes that build workers import them. The registry imports
nothing of the package at import time, so the workers below the algorithms (the eval worker
builds its algorithm's rollout worker) may use it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetrl.errors import ConfigError, nearest

if TYPE_CHECKING:
    from fleetrl.config.schema import AlgorithmConfig, Config

ENTRY_POINT_GROUP = "fleetrl.algorithms"
SHARED_PACKAGE = "common"  # the pieces several algorithms use: no algorithm


@functools.cache
def builtin_names() -> tuple[str, ...]:
    """The built-in algorithms: the packages beside this module, the default `algorithm.name` first."""
    from fleetrl.config.schema import AlgorithmConfig

    here = importlib.import_module(__package__)
    names = [info.name for info in pkgutil.iter_modules(here.__path__) if info.ispkg and info.name != SHARED_PACKAGE]
    return tuple(sorted(names, key=lambda name: (name != AlgorithmConfig.name, name)))


def builtin_module(name: str) -> str:
    """The module that registers built-in algorithm `name`."""
    return f"{__package__}.{name}.spec"


def imported(reference: type | str) -> type:
    """A class, given as itself or as 'package.module:Class' (imported now)."""
    if isinstance(reference, type):
        return reference
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def no_rule(*_args: Any) -> None:
    """A hook with nothing to check."""


@dataclass(frozen=True)
class ConsoleMetric:
    """One metric of the console line: `<label> <value:format>`, left out while the record has
    no value for it (e.g. an off-policy algorithm's losses before learning starts)."""

    key: str
    label: str
    format: str = ".3f"


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config: type[AlgorithmConfig]  # the `algorithm` section's dataclass (a subclass of AlgorithmConfig)
    # Its workers: classes, or 'module:Class' references imported where a worker is built (the
    # built-ins' references keep torch out of the processes that only check a config).
    actor: type | str  # an `ActorBase` subclass
    rollout: type | str  # a `RolloutWorker` (sub)class
    console_metrics: tuple[ConsoleMetric, ...] = ()  # shown after the return on the console line
    # Cross-field rules that need only the config (run by `plan.rules.validate`).
    validate: Callable[[Config], None] = no_rule
    # What a run of it reads before it starts, such as its demonstrations folder (run by
    # `plan.rules.check_inputs`: for a run and the doctor, not for a finished run's saved config
    # read back by `fleetrl eval` or `export`, whose inputs may have moved or changed since).
    check_inputs: Callable[[Config], None] = no_rule
    # Rules that need the actor world size (run by `plan.rules.check_actor_layout`).
    check_layout: Callable[[Config, int], None] = no_rule
    # Rules that need the env's spaces (`plan.rules.check_spaces`, before any actor is built).
    check_spaces: Callable[[Config, Any, Any], None] = no_rule
    # Which command runs it: 'rl' (`fleetrl train`) or 'sft' (`fleetrl sft`: a supervised stage,
    # such as behaviour cloning on demonstrations).
    stage: str = "rl"
    # Whether its actor trains on samples that older policy versions acted (`runner.asynchronous`:
    # docs/concepts/async.md); an algorithm that says no makes that key a config error.
    asynchronous: bool = False

    def actor_class(self) -> type:
        return imported(self.actor)

    def rollout_class(self) -> type:
        return imported(self.rollout)


REGISTRY: dict[str, AlgorithmSpec] = {}


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Make `spec` available as `algorithm.name: <spec.name>`. Registering a name again replaces
    its spec (a module re-imported, a test's algorithm redefined)."""
    if not (isinstance(spec.config, type) and dataclasses.is_dataclass(spec.config)):
        raise TypeError(f"algorithm {spec.name!r}: its config must be a dataclass (a subclass of AlgorithmConfig)")
    REGISTRY[spec.name] = spec
    return spec


def unregister_algorithm(name: str) -> None:
    """Forget the spec registered as `name`, so that what a caller registered for a while (a
    test's algorithm) does not outlive its use. A built-in's module registers it only once."""
    if name in builtin_names():
        raise ValueError(f"{name!r} is a built-in algorithm")
    del REGISTRY[name]


def load_builtins() -> None:
    for name in builtin_names():
        importlib.import_module(builtin_module(name))


def installed_plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """Algorithms that installed packages declare in the `fleetrl.algorithms` entry-point group."""
    return {entry.name: entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def load_plugin(entry: importlib.metadata.EntryPoint) -> None:
    """Import the plugin; an entry point that names an `AlgorithmSpec` is registered, one that
    names a module registers itself on import."""
    loaded = entry.load()
    if isinstance(loaded, AlgorithmSpec):
        register_algorithm(loaded)
    if entry.name not in REGISTRY:
        raise ConfigError(
            "algorithm.name",
            entry.name,
            f"an algorithm that {entry.value} registers",
            f"the '{ENTRY_POINT_GROUP}' entry point {entry.name} = {entry.value} registered none by that name",
        )


def algorithm_names() -> list[str]:
    """Every registered or installed algorithm's name, the built-ins first."""
    load_builtins()
    others = {*REGISTRY, *installed_plugins()} - set(builtin_names())
    return [*builtin_names(), *sorted(others)]


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The spec registered as `name` (a built-in, one registered in this process, or an installed
    plugin's); a `ConfigError` at 'algorithm.name' naming the available algorithms for any other."""
    if isinstance(name, str):
        if name not in REGISTRY and name in builtin_names():
            importlib.import_module(builtin_module(name))
        if name not in REGISTRY and name in (plugins := installed_plugins()):
            load_plugin(plugins[name])
        if name in REGISTRY:
            return REGISTRY[name]
    names = algorithm_names()
    raise ConfigError("algorithm.name", name, f"one of {names}", nearest(str(name), names))


class RegisteredSections:
    """The registry as the loader's `AlgorithmSections` (config/loader.py): config/ imports no
    algorithm, so the plan hands it this."""

    def names(self) -> list[str]:
        return algorithm_names()

    def section(self, name: str) -> type[AlgorithmConfig]:
        return algorithm_spec(name).config


SECTIONS = RegisteredSections()
