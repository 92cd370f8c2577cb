"""A short-timeout collective handshake: spawn the ranks, join the process group, one all_reduce.

The seed's run waited silently until "Gloo connectFullMesh failed". Here each rank joins through
the trainer's own `fleetrl.parallel.process_group.init_process_group` (same backend choice, same
loopback interface pinning, same tcp:// rendezvous with rank 0 hosting it, same timeout handling
and JoinError), in throwaway processes under a deadline of seconds: what passes here is the code
the actor ranks run. A rank that is still waiting at the deadline is killed and its last phase —
what the join said it was waiting for — is reported.

Run as a module, this file is one rank (see processes.py for the protocol).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from fleetrl import exit_codes
from fleetrl.doctor.context import Context
from fleetrl.doctor.peer_failure import PeerWatch
from fleetrl.doctor.processes import Outcome, read_payload, report_phase, report_result, run_probes
from fleetrl.doctor.reachability import probe
from fleetrl.doctor.result import Check, failed, passed, skipped
from fleetrl.net import free_port

MODULE = "fleetrl.doctor.handshake"
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # torch: every rank joins a store hosted elsewhere


@dataclass
class Handshake:
    backend: str
    world_size: int
    store: str  # host:port of the rendezvous store
    ok: bool
    seconds: float
    detail: str
    outcomes: list[Outcome] = field(default_factory=list)


def run_handshake(
    world_size: int,
    *,
    backend: str = "gloo",
    store_host: str = "127.0.0.1",
    store_port: int | None = None,
    timeout: float = 15.0,
    env: dict[str, str] | None = None,
) -> Handshake:
    """Spawn `world_size` ranks that join a process group at store_host through the trainer's own
    `process_group.init_process_group` and all_reduce once.

    With `store_port` None, rank 0 hosts the rendezvous on a free port of `store_host`, as actor
    rank 0 does in a run. Otherwise a store is already hosted there (by a torchelastic agent, or a
    test) and every rank joins it as a client; it must answer within `timeout` seconds.
    """
    start = time.monotonic()
    env = dict(env or {})
    if store_port is None:
        store_port = free_port(store_host)
    else:
        reached = probe(store_host, store_port, min(timeout, 2.0))  # refused: fail now, not after retries
        if not reached.ok:
            return Handshake(
                backend,
                world_size,
                f"{store_host}:{store_port}",
                False,
                time.monotonic() - start,
                f"the rendezvous store {store_host}:{store_port} is unreachable: {reached.error}",
            )
        env[AGENT_STORE] = "True"  # torch's tcp:// rendezvous: every rank a client of that store
    address = f"{store_host}:{store_port}"
    payloads = rank_payloads(world_size, backend, store_host, store_port, timeout)
    outcomes = run_probes(MODULE, payloads, deadline_s=timeout, env=env)
    return summarize(outcomes, backend, world_size, address, time.monotonic() - start)


def rank_payloads(world_size: int, backend: str, store_host: str, store_port: int, timeout: float) -> list[dict]:
    """What each rank's probe process gets; ranks give up on their own before the deadline."""
    rank_timeout = max(1.0, 0.7 * timeout)
    return [
        {
            "rank": rank,
            "world_size": world_size,
            "host": store_host,
            "port": store_port,
            "backend": backend,
            "timeout": rank_timeout,
        }
        for rank in range(world_size)
    ]


def summarize(outcomes: list[Outcome], backend: str, world_size: int, address: str, seconds: float) -> Handshake:
    """The handshake's verdict from every rank's outcome (in rank order)."""
    results = [outcome.result or {} for outcome in outcomes]
    if all(result.get("ok") for result in results):
        rendezvous = max(result["init_s"] for result in results)
        reduce = max(result["all_reduce_s"] for result in results)
        return Handshake(
            backend,
            world_size,
            address,
            True,
            seconds,
            f"{world_size} ranks rendezvoused at {address} in {rendezvous:.2f} s, "
            f"all_reduce took {reduce * 1000:.1f} ms ({seconds:.1f} s with start-up)",
            outcomes,
        )
    return Handshake(
        backend,
        world_size,
        address,
        False,
        seconds,
        f"{world_size} ranks at {address}: {describe_failures(outcomes)}",
        outcomes,
    )


def describe_failures(outcomes: list[Outcome]) -> str:
    """What each failed rank was doing, ranks with the same story told once."""
    stories: dict[str, list[int]] = {}
    for rank, outcome in enumerate(outcomes):
        if (outcome.result or {}).get("ok"):
            continue
        if outcome.timed_out:
            story = f"still {outcome.last_phase} after {outcome.seconds:.1f} s (killed)"
        else:
            story = f"failed while {outcome.last_phase}: {outcome.error_text()}"
        stories.setdefault(story, []).append(rank)
    return "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} {story}" for story, ranks in stories.items()
    )


def handshake_size(context: Context, devices: int | None = None) -> tuple[int, str]:
    """How many ranks to spawn here, and a note on where the number comes from."""
    options = context.options
    if options.handshake_processes:
        return options.handshake_processes, "--handshake-processes"
    note = "the default"
    count = 2
    try:
        placement = context.view.placement()
    except Exception:  # a broken placement is the placement check's to report
        placement = None
    if placement is not None:
        actor = placement.ranks("actor")
        local = [a for a in actor if a.node == context.view.node]
        count = max(2, len(local))
        note = (
            f"node {context.view.node} holds {len(local)} of the actor's {len(actor)} "
            f"rank(s){'; 2 at least are tried' if len(local) < 2 else ''}"
        )
    if devices is not None:
        count = min(count, devices)
    if count > options.max_handshake_processes:
        note += f", capped at {options.max_handshake_processes}"
        count = options.max_handshake_processes
    return count, note


def store_host(context: Context) -> str:
    if not context.view.remote_peers:
        return "127.0.0.1"
    from fleetrl.doctor.interfaces import advertised_address

    return advertised_address(context).address


def handshake_check(context: Context, backend: str, world_size: int, note: str) -> Check:
    name = f"{backend}.handshake"
    result = run_handshake(
        world_size,
        backend=backend,
        store_host=store_host(context),
        timeout=context.options.handshake_timeout,
        env=context.view.configured_env_vars(),
    )
    check = (
        passed(name, f"{backend}: {result.detail} [{note}]")
        if result.ok
        else failed(
            name,
            f"{backend}: {result.detail} [{note}]",
            f"look at the error or the phase that stalled: a rendezvous (store) that does not answer "
            f"means a wrong or blocked address/port; a failure or stall connecting to the other ranks "
            f"(Gloo connectFullMesh, an interface not found) means the ranks cannot connect to each "
            f"other — set GLOO_SOCKET_IFNAME{'/NCCL_SOCKET_IFNAME' if backend == 'nccl' else ''}"
            f" to the interface between the nodes and open the ports between them",
        )
    )
    return replace(check, seconds=result.seconds)


def check_gloo_here(context: Context) -> list[Check]:
    """Ranks spawned on this machine (see placed_handshake.py for the ranks on their nodes)."""
    world_size, note = handshake_size(context)
    return [handshake_check(context, "gloo", world_size, note)]


def check_nccl(context: Context) -> list[Check]:
    import torch

    if not torch.cuda.is_available():
        return [skipped("nccl.handshake", "no GPU: NCCL is not used here")]
    world_size, note = handshake_size(context, devices=torch.cuda.device_count())
    return [handshake_check(context, "nccl", world_size, note)]


# ---- one rank ---------------------------------------------------------------------------------


def main() -> int:
    payload = read_payload()
    rank, world_size, backend = payload["rank"], payload["world_size"], payload["backend"]
    peers = PeerWatch(payload["host"], payload["port"], rank, world_size, payload["timeout"])
    try:
        report_phase("importing torch")
        import torch
        import torch.distributed as dist

        from fleetrl.parallel import process_group

        device = torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")
        start = time.monotonic()
        process_group.init_process_group(
            rank,
            world_size,
            payload["host"],
            payload["port"],
            payload["timeout"],
            device,
            timeout_key="0.7 x the doctor's --handshake-timeout",
            narrate=report_phase,
        )
        init_s = time.monotonic() - start
        report_phase("in all_reduce")
        start = time.monotonic()
        tensor = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        all_reduce_s = time.monotonic() - start
        expected = world_size * (world_size + 1) / 2
        if not torch.all(tensor == expected):
            raise RuntimeError(f"all_reduce gave {tensor[0].item()}, expected {expected}")
        peers.done()
        report_phase("in destroy_process_group")
        process_group.destroy_process_group()
    except Exception as error:  # reported to the doctor, which names the rank and the phase
        first_line = (str(error).strip().splitlines() or [""])[0]
        report_result({"ok": False, "rank": rank, "error": f"{type(error).__name__}: {first_line}"})
        peers.failed()
        return exit_codes.ERROR
    report_result({"ok": True, "rank": rank, "init_s": init_s, "all_reduce_s": all_reduce_s})
    return exit_codes.OK


if __name__ == "__main__":
    raise SystemExit(main())
