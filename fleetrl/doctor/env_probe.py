"""One simulator built from the config, reset, and stepped once with a random action.

It runs in a separate process under `env_timeout`: a simulator that hangs in its constructor,
reset or step (a renderer waiting for a display, a licence server, a deadlocked plugin) is reported
with the phase it hung in, then killed, instead of freezing the doctor.

Run as a module, this file is the probe (see processes.py for the protocol).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import replace
from typing import Any

from fleetrl import exit_codes
from fleetrl.doctor.cluster_view import ClusterView
from fleetrl.doctor.context import Context
from fleetrl.doctor.on_nodes import START_UP_S, live_nodes, on_every_node
from fleetrl.doctor.processes import Outcome, read_payload, report_phase, report_result, run_probes
from fleetrl.doctor.resources import ray_connected
from fleetrl.doctor.result import Check, failed, passed

MODULE = "fleetrl.doctor.env_probe"


def env_nodes(context: Context) -> str:
    try:
        placement = context.view.placement()
    except Exception:  # a broken placement is the placement check's to report
        return ""
    if placement is None:
        return ""
    nodes = placement.nodes_of("env")
    others = [node for node in nodes if node != context.view.node]
    if not others:
        return ""
    return f" [checked on node {context.view.node} only; run `fleetrl doctor --node N` on env node(s) {others} too]"


def check_env(context: Context) -> list[Check]:
    """Here, or, on a joined Ray cluster, on every node that holds env ranks, with that node's
    `cluster.env_vars`: an import or a file that only one node lacks fails there, by name."""
    if ray_connected():
        return check_env_on_nodes(context)
    (outcome,) = run_probes(
        MODULE, [env_payload(context.config)], context.options.env_timeout, env=context.view.configured_env_vars()
    )
    return [env_check(context.config.env, outcome, context.options.env_timeout, where=env_nodes(context))]


def env_payload(config: Any) -> dict:
    return {"env": dataclasses.asdict(config.env), "seed": getattr(config.runner, "seed", 0)}


def probe_on_node(node: int, config: Any, timeout: float) -> Outcome:
    """Runs on node `node`: the probe in a process of that node, with the node's variables and
    its index, as an env worker placed there has them."""
    env = {**ClusterView(config, node=node).configured_env_vars(), "FLEETRL_NODE_RANK": str(node)}
    (outcome,) = run_probes(MODULE, [env_payload(config)], timeout, env=env)
    return outcome


def check_env_on_nodes(context: Context) -> list[Check]:
    try:
        placement = context.view.placement()
    except Exception:  # a broken placement is the placement check's to report
        placement = None
    env_nodes = placement.nodes_of("env") if placement is not None else None
    timeout = context.options.env_timeout
    checks = []
    for outcome in on_every_node(
        live_nodes(), probe_on_node, (context.config, timeout), START_UP_S + timeout, env_nodes
    ):
        name = f"env.reset_step.node{outcome.index}"
        if outcome.error:
            checks.append(outcome.did_not_run(name))
            continue
        check = env_check(context.config.env, outcome.result, timeout)
        checks.append(replace(check, name=name, detail=f"{outcome.source}: {check.detail}"))
    return checks


def env_check(env_config: Any, outcome: Outcome, timeout: float, where: str = "") -> Check:
    result = outcome.result or {}
    if result.get("ok"):
        check = passed(
            "env.reset_step",
            f"{env_config.id}: built in {result['build_s']:.2f} s, "
            f"reset {result['reset_s'] * 1000:.1f} ms, step "
            f"{result['step_s'] * 1000:.1f} ms; observation "
            f"{result['observation']}, action space "
            f"{result['action_space']}{where}",
        )
    elif outcome.timed_out:
        check = failed(
            "env.reset_step",
            f"{env_config.id}: still {outcome.last_phase} after {outcome.seconds:.1f} s "
            f"(timeout {timeout:g} s; killed){where}",
            f"the simulator hangs {outcome.last_phase}: build and reset it alone in "
            f"Python and look at its logs; if it is only slow to start, raise "
            f"--env-timeout",
        )
    else:
        check = failed(
            "env.reset_step",
            f"{env_config.id}: failed while {outcome.last_phase}: {outcome.error_text()}{where}",
            "fix the error above; env.id and env.kwargs are passed to the simulator as written in the config",
        )
    return replace(check, seconds=outcome.seconds)


def summarize_space(space) -> str:
    if hasattr(space, "n") and not getattr(space, "shape", None):
        return f"{type(space).__name__}({space.n})"
    shape = getattr(space, "shape", None)
    return f"{type(space).__name__}{tuple(shape) if shape else ''}"


def summarize_observation(observation) -> str:
    shape = getattr(observation, "shape", None)
    if shape is not None:
        return f"shape {tuple(shape)}"
    if isinstance(observation, dict):
        return "{" + ", ".join(f"{k}: {summarize_observation(v)}" for k, v in observation.items()) + "}"
    return type(observation).__name__


# ---- the probe ---------------------------------------------------------------------------------


def main() -> int:
    payload = read_payload()
    try:
        from fleetrl.config.schema import EnvConfig
        from fleetrl.envs.make import env_factory

        config = EnvConfig(**payload["env"])
        report_phase(f"building the env ({config.id})")
        start = time.monotonic()
        env = env_factory(config)()
        build_s = time.monotonic() - start
        report_phase("in env.reset()")
        start = time.monotonic()
        observation, _ = env.reset(seed=payload["seed"])
        reset_s = time.monotonic() - start
        env.action_space.seed(payload["seed"])
        action = env.action_space.sample()
        report_phase("in env.step() with a random action")
        start = time.monotonic()
        env.step(action)
        step_s = time.monotonic() - start
        report_phase("in env.close()")
        env.close()
    except Exception as error:  # reported with the phase it happened in
        first_line = (str(error).strip().splitlines() or [""])[0]
        report_result({"ok": False, "error": f"{type(error).__name__}: {first_line}"})
        return exit_codes.ERROR
    report_result(
        {
            "ok": True,
            "build_s": build_s,
            "reset_s": reset_s,
            "step_s": step_s,
            "observation": summarize_observation(observation),
            "action_space": summarize_space(env.action_space),
        }
    )
    return exit_codes.OK


if __name__ == "__main__":
    raise SystemExit(main())
