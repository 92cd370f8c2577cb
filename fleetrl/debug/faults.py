"""Fault injection (`debug.fault`), to rehearse failures on purpose and to test fleetrl's diagnosis.

    debug:
      fault: {kind: kill, component: actor, rank: 1, method: train, call: 3}

fires on the 3rd call of `train` on actor rank 1 (`method` defaults to the component's main
method, `rank` to 0, `call` to 1; `check_fault` rejects anything that could never fire). The
components: env, rollout, actor, and eval (the eval worker, in a run with runner.eval_interval > 0;
its main method `run` is one whole evaluation). Kinds:
  kill              SIGKILL the worker process
  stop              SIGSTOP it (frozen, not dead)
  exception         raise an error inside the worker
  hang              block forever in a sleep (a simulator that never returns; the GIL is free)
  gil_hang          spin forever in C code holding the GIL (heartbeats stop too)
  extra_collective  (actor) after the call, an all_reduce that no other rank makes
  extra_step        (actor) train twice: one rank doing more optimisation steps than the others
  hang_in_forward   (actor) the next forward pass of the rank's model blocks forever (a forward
                    pre-hook that sleeps: a user model waiting on something); its peers wait in
                    DDP's gradient all-reduce
  skip_forward      (actor) the call returns at once, without its forward, backward, optimizer step
                    and collectives (an early return on local data): the peers wait in DDP's
                    gradient all-reduce for a rank that skipped it
  nan_reward        (env) the simulators' answer to the call (a step, or a reset) has a NaN
                    reward for the worker's env 0: a simulator whose reward turns NaN
  nan_obs           (env) ... a NaN in the first element of env 0's observation
  nan_loss          (actor) from the call on, the policy's value output in the loss is NaN (a
                    forward hook of the policy): the loss turns NaN
  inf_grad          (actor) from the call on, the gradient of the policy's first trainable
                    parameter is infinite (a hook on that tensor): an exploding gradient
  hang_in_denoising (rollout or actor, with model.action_head: flow) the next forward of the flow
                    action expert blocks forever (a forward pre-hook that sleeps): inside the
                    denoising loop of acting (a rollout) or of the loss path (an actor rank)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from fleetrl.errors import ConfigError, nearest

KINDS = (
    "kill",
    "stop",
    "exception",
    "hang",
    "gil_hang",
    "extra_collective",
    "extra_step",
    "hang_in_forward",
    "skip_forward",
    "nan_reward",
    "nan_obs",
    "nan_loss",
    "inf_grad",
    "hang_in_denoising",
)
ACTOR_ONLY = ("extra_collective", "extra_step", "hang_in_forward", "skip_forward", "nan_loss", "inf_grad")
ENV_ONLY = ("nan_reward", "nan_obs")
DEFAULT_METHOD = {"env": "step", "rollout": "act", "actor": "train", "eval": "run"}  # the component's main method
FAULT_KEYS = ("kind", "component", "rank", "method", "call")  # rank defaults to 0, call to 1


class InjectedFault(RuntimeError):
    """The error raised by `kind: exception`."""


def check_fault(fault: dict, algorithm: str) -> None:
    """`debug.fault` before anything starts: a misspelt key, kind, component or method would
    otherwise never fire, silently. Its rank is checked against the placement later
    (plan/rules.py `check_fault_placement`)."""
    if not fault:
        return
    for key in fault:
        if key not in FAULT_KEYS:
            raise ConfigError(
                f"debug.fault.{key}", fault[key], f"one of the keys {list(FAULT_KEYS)}", nearest(str(key), FAULT_KEYS)
            )
    for key in ("kind", "component"):
        if key not in fault:
            raise ConfigError(
                f"debug.fault.{key}",
                None,
                f"one of {list(KINDS if key == 'kind' else DEFAULT_METHOD)}",
                "kind and component are required",
            )
    kind, component = fault["kind"], fault["component"]
    if kind not in KINDS:
        raise ConfigError("debug.fault.kind", kind, f"one of {list(KINDS)}", nearest(str(kind), KINDS))
    if component not in tuple(DEFAULT_METHOD):  # (a tuple: an unhashable value is just not in it)
        raise ConfigError(
            "debug.fault.component",
            component,
            f"one of {list(DEFAULT_METHOD)}",
            nearest(str(component), DEFAULT_METHOD),
        )
    if kind == "hang_in_denoising" and component not in ("rollout", "actor"):
        raise ConfigError(
            "debug.fault.component",
            component,
            "'rollout' or 'actor' with kind 'hang_in_denoising' (the workers that run the flow expert)",
        )
    if kind in ACTOR_ONLY and component != "actor":
        raise ConfigError(
            "debug.fault.component",
            component,
            f"'actor' with kind {kind!r} (a collective or an optimisation step only an actor rank makes)",
        )
    if kind in ENV_ONLY and component != "env":
        raise ConfigError(
            "debug.fault.component", component, f"'env' with kind {kind!r} (a value only a simulator returns)"
        )
    for key, low in (("rank", 0), ("call", 1)):
        value = fault.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"debug.fault.{key}", value, f"an integer >= {low}")
    method = fault.get("method")
    if method is None:  # the component's main method, which each of its workers has; checking it
        return  # would import the worker (torch and all) into the supervisor for nothing
    methods = worker_methods(component, algorithm)
    if method not in methods:
        raise ConfigError(
            "debug.fault.method",
            method,
            f"a method of the {component} worker, one of {methods}",
            nearest(str(method), methods),
        )


def worker_methods(component: str, algorithm: str) -> list[str]:
    """The public methods of the component's worker class for this algorithm."""
    from fleetrl.algos.registry import algorithm_spec
    from fleetrl.workers.env_worker import EnvWorker
    from fleetrl.workers.eval_worker import EvalWorker

    spec = algorithm_spec(algorithm)
    worker = {"env": EnvWorker, "rollout": spec.rollout_class(), "actor": spec.actor_class(), "eval": EvalWorker}[
        component
    ]
    return sorted(name for name in dir(worker) if not name.startswith("_") and callable(getattr(worker, name)))


class FaultPlan:
    """Decides, per method call of one worker, whether the configured fault fires now."""

    def __init__(self, fault: dict, component: str, rank: int):
        self.armed = bool(fault) and fault["component"] == component and fault.get("rank", 0) == rank
        self.kind = fault.get("kind")
        self.method = fault.get("method", DEFAULT_METHOD.get(component))
        self.call = fault.get("call", 1)
        self.calls = 0

    def fires(self, method: str) -> bool:
        if not self.armed or method != self.method:
            return False
        self.calls += 1
        return self.calls == self.call

    def strike(self, worker, phase: str, method: str, *args):
        """Run `worker.method(*args)` with the fault injected (phase: the recorded phase's name)."""
        inject_before(self.kind, phase)
        if self.kind == "skip_forward":
            return None
        if self.kind == "hang_in_forward":
            block_in_forward(worker)
        if self.kind == "nan_loss":
            poison_value_output(worker)
        if self.kind == "inf_grad":
            explode_first_gradient(worker)
        if self.kind == "hang_in_denoising":
            worker.policy.network.head.register_forward_pre_hook(sleep_forever)  # the flow expert
        if self.kind == "extra_step":
            getattr(worker, method)(*args)
        if self.kind in ENV_ONLY:
            with poisoned_simulators(worker, self.kind):
                return getattr(worker, method)(*args)
        result = getattr(worker, method)(*args)
        if self.kind == "extra_collective":
            inject_extra_collective()
        return result


def inject_before(kind: str, where: str) -> None:
    """Faults that strike before the method runs."""
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "exception":
        raise InjectedFault(f"injected fault (debug.fault) in {where}")
    elif kind == "hang":
        sleep_forever()
    elif kind == "gil_hang":
        sum(range(10**15))  # one C call that never yields the GIL


def sleep_forever(*_) -> None:
    while True:
        time.sleep(3600)


def block_in_forward(worker) -> None:
    """The next forward pass of any of the actor's models (under DDP, of the module DDP wraps)
    sleeps forever, inside the model's call."""
    for module in worker.replicated_modules().values():
        module.register_forward_pre_hook(sleep_forever)


def poison_value_output(worker) -> None:
    """From now on the value the actor's policy returns in its loss path is NaN (a forward hook)."""
    worker.replicated_modules()[first_module(worker)].register_forward_hook(
        lambda module, inputs, outputs: outputs._replace(value=outputs.value * float("nan"))
    )


def explode_first_gradient(worker) -> None:
    """From now on the gradient of the actor's first trainable parameter is +inf (a tensor hook:
    it fires before DDP reduces the gradient)."""
    import torch

    module = worker.replicated_modules()[first_module(worker)]
    parameter = next(p for p in module.parameters() if p.requires_grad)
    parameter.register_hook(lambda grad: torch.full_like(grad, float("inf")))


def first_module(worker) -> str:
    """The name of the actor's policy among its replicated modules (the first one)."""
    return next(iter(worker.replicated_modules()))


@contextlib.contextmanager
def poisoned_simulators(worker, kind: str):
    """While inside, each of the env worker's vector envs answers with a NaN: in env 0's reward
    (`nan_reward`) or in the first element of its observation (`nan_obs`)."""

    def poison(obs, reward):
        if kind == "nan_reward" and reward is not None:
            reward[0] = float("nan")
        if kind == "nan_obs":
            leaf = next(v for v in (obs.values() if isinstance(obs, dict) else [obs]) if v.dtype.kind == "f")
            leaf[0].flat[0] = float("nan")

    def poisoned_step(step):
        def wrapped(*args, **kwargs):
            obs, reward, terminated, truncated, info = step(*args, **kwargs)
            reward = reward.astype(float)
            poison(obs, reward)
            return obs, reward, terminated, truncated, info

        return wrapped

    def poisoned_reset(reset):
        def wrapped(*args, **kwargs):
            obs, info = reset(*args, **kwargs)
            poison(obs, None)
            return obs, info

        return wrapped

    vectors = list(worker.stages)
    for vector in vectors:
        vector.step, vector.reset = poisoned_step(vector.step), poisoned_reset(vector.reset)
    try:
        yield
    finally:
        for vector in vectors:
            del vector.step, vector.reset  # the class's methods again


def inject_extra_collective() -> None:
    """After the method: one all_reduce more than the other ranks make."""
    import torch  # here, not at the top: an env worker imports this module and never needs torch

    from fleetrl.parallel import reduce

    reduce.all_reduce_sum(torch.zeros(7))
