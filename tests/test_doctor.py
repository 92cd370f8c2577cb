"""`fleetrl doctor`: each preflight check against the real thing it guards against.

A full disk is a real 1 MiB tmpfs filled to the brim, an unreachable peer a 127.0.0.1 port nothing
listens on, a hung rendezvous a listener that never answers, a hung simulator one whose reset never
returns. Every address used is on loopback; every process a check starts is gone when it returns.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fleetrl.doctor import (
    Check,
    DoctorOptions,
    Status,
    add_doctor_arguments,
    command_doctor,
    preflight,
    run_checks,
    run_doctor,
)
from fleetrl.doctor.context import Context
from fleetrl.doctor.disk import check_directory
from fleetrl.doctor.handshake import run_handshake
from fleetrl.doctor.interfaces import interfaces
from fleetrl.doctor.processes import RESULT
from fleetrl.exit_codes import CHECK_FAILED, OK
from fleetrl.net import free_port
from fleetrl.plan.load import load_config
from tests.support import LOADED_HOST_MARGIN_S, fill, fleetrl, mounted_tmpfs, own_children, reaping_new_children

MIB = 1024**2


# ---- helpers ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch):
    """The variables the doctor reads come from each test, not from the machine's shell."""
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RAY_TMPDIR", "RAY_ADDRESS", "RAY_object_spilling_config"):
        monkeypatch.delenv(name, raising=False)


TWO_ACTOR_RANKS = ("cluster.devices_per_node=2", "cluster.component_placement={actor: 0-1, env: 0}")
ACTOR_ON_TWO_NODES = (
    "cluster.num_nodes=2",
    "cluster.devices_per_node=1",
    "cluster.component_placement={actor: 0-1, env: 0}",
)
LENIENT_DISK = {"min_free_bytes": 0, "max_used_percent": 100.0, "warn_used_percent": 100.0}


def make_config(tmp_path: Path, *overrides: str):
    return load_config(None, [f"runner.run_dir={tmp_path / 'runs'}", *overrides])


def doctor(config, *, only=None, fast=False, **options) -> tuple[int, str]:
    """run_doctor's exit code and text output."""
    out = io.StringIO()
    code = run_doctor(config, json_output=False, fast=fast, only=only, options=DoctorOptions(**options), stream=out)
    return code, out.getvalue()


def doctor_json(config, *, only=None, fast=False, **options) -> tuple[int, dict]:
    out = io.StringIO()
    code = run_doctor(config, json_output=True, fast=fast, only=only, options=DoctorOptions(**options), stream=out)
    return code, json.loads(out.getvalue())


def checks_named(document: dict, name: str) -> list[dict]:
    found = [check for check in document["checks"] if check["name"] == name]
    assert found, f"no check {name!r} in {[c['name'] for c in document['checks']]}"
    return found


def run(config, check: str, **options) -> list[Check]:
    return run_checks(Context(config, DoctorOptions(**options)), fast=False, only=[check])


def one(checks: list[Check], name: str) -> Check:
    (check,) = [c for c in checks if c.name == name]
    return check


def closed_port() -> socket.socket:
    """A 127.0.0.1 port held (bound) but not listening: connecting to it is refused."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    return holder


# ---- disk -------------------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 1 MiB tmpfs, unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "tiny", "1m") as mount_point:
        yield mount_point


@pytest.mark.needs("root", "mounts a 1 MiB tmpfs to fill")
class TestDisk:
    def test_empty_filesystem_passes(self, tiny_fs):
        check = check_directory(
            "disk.run_dir", "run directory", tiny_fs, DoctorOptions(min_free_bytes=MIB // 2), "move it"
        )
        assert check.status is Status.PASS, check
        assert "0% used" in check.detail and "1.0 MiB" in check.detail

    def test_full_filesystem_fails_with_the_percentage_and_a_fix(self, tiny_fs):
        fill(tiny_fs)
        check = check_directory(
            "disk.run_dir", "run directory", tiny_fs, DoctorOptions(min_free_bytes=0), "point runner.run_dir elsewhere"
        )
        assert check.status is Status.FAIL
        assert "100% used" in check.detail and "at or over 95%" in check.detail
        assert str(tiny_fs) in check.remedy and "point runner.run_dir elsewhere" in check.remedy

    def test_too_little_free_space_fails_even_when_mostly_empty(self, tiny_fs):
        check = check_directory("disk.run_dir", "run directory", tiny_fs, DoctorOptions(), "x")
        assert check.status is Status.FAIL
        assert "under the 1.0 GiB minimum" in check.detail

    def test_thresholds_are_parameters(self, tiny_fs):
        (tiny_fs / "half").write_bytes(b"\0" * (MIB // 2 + 64 * 1024))
        options = DoctorOptions(min_free_bytes=0, max_used_percent=99, warn_used_percent=40)
        check = check_directory("disk.run_dir", "run directory", tiny_fs, options, "x")
        assert check.status is Status.WARN, check
        options = DoctorOptions(min_free_bytes=0, max_used_percent=40)
        assert check_directory("d", "d", tiny_fs, options, "x").status is Status.FAIL

    def test_doctor_catches_a_full_ray_temp_dir(self, tiny_fs, tmp_path, monkeypatch):
        """The seed's '/tmp/ray/session... is over 95% full', caught before the run."""
        fill(tiny_fs)
        monkeypatch.setenv("RAY_TMPDIR", str(tiny_fs))
        code, document = doctor_json(make_config(tmp_path), only=["disk"], min_free_bytes=0)
        assert code == CHECK_FAILED and document["ok"] is False
        (ray_temp,) = checks_named(document, "disk.ray_temp")
        assert ray_temp["status"] == "fail"
        assert f"{tiny_fs}/ray (on {tiny_fs})" in ray_temp["detail"]  # not created yet: its parent
        assert "RAY_TMPDIR" in ray_temp["remedy"]
        # the run directory is judged on its own filesystem (this host's, whose fill varies: a
        # stop-50 rehearsal found it over the 90 % warning), not on the full one
        (run_dir,) = checks_named(document, "disk.run_dir")
        own = check_directory("disk.run_dir", "run directory", tmp_path / "runs", DoctorOptions(min_free_bytes=0), "x")
        assert run_dir["status"] == own.status and str(tiny_fs) not in run_dir["detail"], (run_dir, own)

    def test_run_dir_and_spill_dir_from_the_config_and_ray_settings(self, tiny_fs, tmp_path, monkeypatch):
        fill(tiny_fs)
        spill = json.dumps({"type": "filesystem", "params": {"directory_path": str(tiny_fs)}})
        monkeypatch.setenv("RAY_object_spilling_config", spill)
        config = load_config(None, [f"runner.run_dir={tiny_fs}/runs"])
        code, text = doctor(config, only=["disk"], min_free_bytes=0)
        assert code == CHECK_FAILED
        failures = [line for line in text.splitlines() if line.startswith("FAIL")]
        assert [line.split()[1] for line in failures] == ["disk.run_dir", "disk.ray_spill"]


# ---- network: advertised address and interfaces -------------------------------------------------


class TestInterfaces:
    def test_nonexistent_gloo_socket_ifname_fails_naming_the_real_ones(self, tmp_path, monkeypatch):
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
        config = make_config(tmp_path, *TWO_ACTOR_RANKS)
        check = one(run(config, "network"), "network.GLOO_SOCKET_IFNAME")
        assert check.status is Status.FAIL
        assert "no interface named 'nosuch0'" in check.detail and "the environment" in check.detail
        assert "lo (127.0.0.1)" in check.remedy

    def test_a_bad_interface_only_warns_when_no_process_group_uses_it(self, tmp_path, monkeypatch):
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
        check = one(run(make_config(tmp_path), "network"), "network.GLOO_SOCKET_IFNAME")
        assert check.status is Status.WARN and "the actor has one rank" in check.detail

    def test_per_node_env_vars_from_the_config_are_checked(self, tmp_path, monkeypatch):
        config = make_config(
            tmp_path,
            *TWO_ACTOR_RANKS,
            "actor.device=cuda",
            "cluster.env_vars={NCCL_SOCKET_IFNAME: lo, 1: {NCCL_SOCKET_IFNAME: nosuch}}",
        )
        assert one(run(config, "network"), "network.NCCL_SOCKET_IFNAME").status is Status.PASS
        check = one(run(config, "network", node=1), "network.NCCL_SOCKET_IFNAME")
        assert check.status is Status.FAIL
        assert "cluster.env_vars for node 1" in check.detail
        assert "no interface starting with 'nosuch'" in check.detail

    def test_nccl_prefixes_exact_names_and_exclusions(self, tmp_path, monkeypatch):
        config = make_config(tmp_path, *TWO_ACTOR_RANKS, "actor.device=cuda")
        for value, status in [("l", Status.PASS), ("=l", Status.FAIL), ("=lo", Status.PASS), ("^nosuch", Status.PASS)]:
            monkeypatch.setenv("NCCL_SOCKET_IFNAME", value)
            check = one(run(config, "network"), "network.NCCL_SOCKET_IFNAME")
            assert check.status is status, (value, check)
        every = ",".join(interfaces())
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^" + every)
        check = one(run(config, "network"), "network.NCCL_SOCKET_IFNAME")
        assert check.status is Status.FAIL and "excludes every usable interface" in check.detail
        cpu_only = make_config(tmp_path, *TWO_ACTOR_RANKS)
        check = one(run(cpu_only, "network"), "network.NCCL_SOCKET_IFNAME")
        assert check.status is Status.WARN and "the config runs on CPU" in check.detail

    def test_unset_interface_variables_are_skipped_with_a_reason(self, tmp_path, monkeypatch):
        monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
        check = one(run(make_config(tmp_path), "network"), "network.GLOO_SOCKET_IFNAME")
        assert check.status is Status.SKIP and "unset" in check.detail

    def test_single_node_rendezvous_on_loopback_passes(self, tmp_path):
        check = one(run(make_config(tmp_path), "network"), "network.advertised_address")
        assert check.status is Status.PASS and "single node" in check.detail

    def test_loopback_interface_with_remote_peers_fails(self, tmp_path, monkeypatch):
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
        config = make_config(tmp_path, *ACTOR_ON_TWO_NODES)
        checks = run(config, "network")
        gloo = one(checks, "network.GLOO_SOCKET_IFNAME")
        assert gloo.status is Status.FAIL and "lo is loopback" in gloo.detail
        advertised = one(checks, "network.advertised_address")
        assert advertised.status is Status.FAIL
        assert "the loopback address 127.0.0.1 (interface lo" in advertised.detail
        assert "connectFullMesh" in advertised.detail
        assert "GLOO_SOCKET_IFNAME" in advertised.remedy and "cluster.env_vars" in advertised.remedy

    def test_hostname_resolving_to_loopback_with_remote_peers_fails(self, tmp_path, monkeypatch):
        """The /etc/hosts '127.0.1.1 myhost' trap, with a hostname that really resolves so."""
        monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
        check = one(run(make_config(tmp_path, *ACTOR_ON_TWO_NODES), "network"), "network.advertised_address")
        assert check.status is Status.FAIL
        assert "hostname 'localhost' resolves to it" in check.detail
        # the seed's layout: the actor on node 0 only, envs on node 1 — Gloo stays on one machine
        one_node_actor = make_config(
            tmp_path,
            "cluster.num_nodes=2",
            "cluster.devices_per_node=2",
            "cluster.component_placement={actor: 0-1, env: 2-3}",
        )
        check = one(run(one_node_actor, "network"), "network.advertised_address")
        assert check.status is Status.WARN and "span nodes" in check.detail

    def test_simulated_nodes_share_this_machine_so_loopback_is_fine(self, tmp_path):
        config = make_config(tmp_path, "cluster.num_nodes=2", "cluster.simulate_nodes=2")
        check = one(run(config, "network"), "network.advertised_address")
        assert check.status is Status.PASS and "simulated" in check.detail


# ---- network: reachability --------------------------------------------------------------------


class TestReachability:
    def test_doctor_catches_an_unreachable_peer_as_refused_not_timed_out(self, tmp_path):
        with closed_port() as holder:
            port = holder.getsockname()[1]
            code, text = doctor(make_config(tmp_path), only=["reachability"], peers=(f"127.0.0.1:{port}",))
        assert code == CHECK_FAILED
        failure = next(line for line in text.splitlines() if line.startswith("FAIL"))
        assert f"127.0.0.1:{port}" in failure and "connection refused" in failure and "timed out" not in failure
        assert "fix:" in text

    def test_listening_peer_and_self_connect_pass(self, tmp_path):
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            code, document = doctor_json(make_config(tmp_path), only=["reachability"], peers=(f"127.0.0.1:{port}",))
        assert code == OK
        self_check, peer = checks_named(document, "network.reachability")
        assert "itself at 127.0.0.1:" in self_check["detail"]
        assert f"127.0.0.1:{port}: connected" in peer["detail"]

    def test_unreachable_ray_head_from_the_config(self, tmp_path):
        with closed_port() as holder:
            port = holder.getsockname()[1]
            config = make_config(tmp_path, f"cluster.ray_address=127.0.0.1:{port}")
            check = run(config, "reachability")[-1]
        assert check.status is Status.FAIL
        assert f"the Ray head (cluster.ray_address) at 127.0.0.1:{port}" in check.detail


# ---- Gloo handshake ---------------------------------------------------------------------------


class TestGlooHandshake:
    def test_two_ranks_rendezvous_and_all_reduce(self, tmp_path):
        code, document = doctor_json(make_config(tmp_path), only=["gloo"])
        (check,) = checks_named(document, "gloo.handshake")
        assert code == OK and check["status"] == "pass", check
        assert "2 ranks rendezvoused at 127.0.0.1:" in check["detail"]
        assert "all_reduce took" in check["detail"]
        assert not own_children()

    def test_unreachable_rendezvous_fails_at_once_naming_it(self):
        """At once: refused before any rank is started, not the 10 s deadline of ranks waiting."""
        with closed_port() as holder:
            port = holder.getsockname()[1]
            result = run_handshake(2, store_port=port, timeout=10)
        assert not result.ok and result.outcomes == [], result.outcomes
        assert f"the rendezvous store 127.0.0.1:{port} is unreachable" in result.detail
        assert "connection refused" in result.detail

    def test_silent_rendezvous_is_killed_at_the_deadline_with_its_phase(self):
        """TCPStore's own timeout does not cover a listener that never answers (it waits
        forever); the deadline does, and every rank is killed."""
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            port = silent.getsockname()[1]
            start = time.monotonic()
            # the deadline covers start-up: importing torch took 8 s on a loaded 2-core host
            result = run_handshake(2, store_port=port, timeout=20)
            elapsed = time.monotonic() - start
        assert not result.ok and 20 <= elapsed <= 20 + LOADED_HOST_MARGIN_S
        # the phase is what fleetrl.parallel.process_group's join says it waits for
        joining = f"ranks 0, 1 still joining the gloo process group at tcp://127.0.0.1:{port} (the rendezvous,"
        assert joining in result.detail, result.detail
        assert "(killed)" in result.detail
        assert all(outcome.timed_out for outcome in result.outcomes)
        assert not own_children()

    def test_ranks_join_through_the_trainers_process_group_code(self):
        """A Gloo interface that does not exist fails every rank inside
        process_group.init_process_group at once: its JoinError, naming the doctor's timeout. The
        timeout covers each rank's start-up (torch's import: 8 s on a loaded host, and at 10 s a
        rank beside a training was once still starting); a rank failing at once never waits it."""
        result = run_handshake(2, timeout=30, env={"GLOO_SOCKET_IFNAME": "nosuch0"})
        assert not result.ok
        assert not any(outcome.timed_out for outcome in result.outcomes)  # failed, not waited out
        for rank in (0, 1):
            assert (
                f"rank {rank} failed while joining the gloo process group at tcp://127.0.0.1:" in result.detail
                and f"JoinError: actor rank {rank} on node " in result.detail
                and "at no IPv4 address on interface nosuch0 (GLOO_SOCKET_IFNAME=nosuch0) could not connect to its "
                "peers after the gloo rendezvous"
                in result.detail
            ), result.detail
        assert "0.7 x the doctor's --handshake-timeout" in result.detail
        assert "Unable to find address for: nosuch0" in result.detail
        assert not own_children()

    def test_a_rank_failing_before_any_watch_reached_the_store_still_stops_its_peer(self):
        """The race CI met on the isolated nodes: rank 0's first connect failed the instant the
        rendezvous ended, before its own watch or its peer's had connected to the store; rank 0
        left, and rank 1 sat in connectFullMesh until the deadline. Here rank 0 fails as soon as
        its store exists, and rank 1's watch starts only after that (torch already imported,
        so the start is a connect): rank 1 must still stop, naming rank 0."""
        port = free_port("127.0.0.1")
        rank_0 = subprocess.Popen(
            [sys.executable, "-c", PEER_WATCH_RANK_0, str(port)], stdout=subprocess.PIPE, text=True
        )
        rank_1 = subprocess.Popen(
            [sys.executable, "-c", PEER_WATCH_RANK_1, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert rank_1.stdout.readline() == "ready\n"
            assert rank_0.stdout.readline() == "failing\n"
            rank_1.stdin.write("watch\n")
            rank_1.stdin.flush()
            told, _ = rank_1.communicate(timeout=60)  # it sleeps 120 s unless its watch stops it
            left, _ = rank_0.communicate(timeout=60)
        finally:
            for process in (rank_0, rank_1):
                process.kill()
                process.wait()
        assert rank_1.returncode == 1, told
        assert RESULT + json.dumps({"ok": False, "rank": 1, "error": "stopped waiting: rank 0 failed"}) in told
        assert rank_0.returncode == 0 and left == "told\n", left


PEER_WATCH_RANK_0 = """
import datetime, sys
import torch.distributed as dist
from fleetrl.doctor.peer_failure import PeerWatch
port = int(sys.argv[1])
timeout = datetime.timedelta(seconds=60)
store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timeout)
watch = PeerWatch("127.0.0.1", port, 0, 2, 60)
print("failing", flush=True)
watch.failed()  # at once: its watch has not connected yet, nor has rank 1's
print("told" if store.add("fleetrl-doctor/known", 0) == 2 else "left untold", flush=True)
"""

PEER_WATCH_RANK_1 = """
import sys, time
import torch.distributed
from fleetrl.doctor.peer_failure import PeerWatch
print("ready", flush=True)
sys.stdin.readline()
PeerWatch("127.0.0.1", int(sys.argv[1]), 1, 2, 60)
time.sleep(120)  # as a rank in connectFullMesh whose peer will never connect
"""


# ---- a live Ray cluster: joining, all pairs of nodes, feasibility --------------------------------


@pytest.fixture
def loopback_ray(monkeypatch):
    """A private one-node Ray on 127.0.0.1 (address='local': never anyone else's cluster)."""
    import ray
    import ray._private.ray_constants as ray_constants

    # On Linux Ray swaps a loopback node address for the machine's routable one; keep loopback.
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    with reaping_new_children():
        ray.init(
            address="local",
            num_cpus=1,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        try:
            yield ray
        finally:
            ray.shutdown()


class TestLiveRay:
    def test_unreachable_ray_address_fails_before_ray_init(self, tmp_path):
        with closed_port() as holder:
            port = holder.getsockname()[1]
            check = one(run(make_config(tmp_path, f"cluster.ray_address=127.0.0.1:{port}"), "ray"), "ray.cluster")
        ray = sys.modules.get("ray")
        assert ray is None or not ray.is_initialized()  # before ray.init: nothing joined, nothing started
        assert not own_children()
        assert check.status is Status.FAIL
        assert f"cannot join the Ray cluster at 127.0.0.1:{port}" in check.detail

    def test_connected_cluster_nodes_pairs_and_placement(self, loopback_ray, tmp_path, monkeypatch):
        from fleetrl.doctor import mesh

        config = make_config(tmp_path, "cluster.devices_per_node=1")
        code, document = doctor_json(config, only=["ray", "placement", "mesh"])
        assert code == OK, document
        (cluster,) = checks_named(document, "ray.cluster")
        assert "1 live node(s): node 0 127.0.0.1 (1 CPU, 0 GPU)" in cluster["detail"]
        (placement,) = checks_named(document, "placement")
        assert "the Ray cluster has 1 node(s)" in placement["detail"]
        (pairs,) = checks_named(document, "network.mesh")
        assert "all 1x1 pairs of nodes connect" in pairs["detail"]

        two_nodes = make_config(
            tmp_path,
            "cluster.num_nodes=2",
            "cluster.devices_per_node=1",
            "cluster.component_placement={actor: 0, env: 1}",
        )
        check = one(run(two_nodes, "placement"), "placement")
        assert check.status is Status.FAIL and "the Ray cluster has 1 live node(s)" in check.detail

        # A second node whose raylet port nothing listens on: every node's probe names the pair.
        real = mesh.live_nodes()
        with closed_port() as holder:
            port = holder.getsockname()[1]
            ghost = {**real[0], "NodeManagerPort": port}
            monkeypatch.setattr(mesh, "live_nodes", lambda: [*real, ghost])
            checks = run(config, "mesh")
        assert [c.status for c in checks] == [Status.FAIL, Status.FAIL]
        assert f"node 0 (127.0.0.1) → node 1 at 127.0.0.1:{port}: unreachable" in checks[0].detail
        assert "connection refused" in checks[0].detail


# ---- CUDA, placement --------------------------------------------------------------------------


class TestCudaAndPlacement:
    @pytest.mark.needs("no_cuda", "the doctor's answer on a machine without a GPU")
    def test_cuda_skipped_without_gpus_unless_asked_for(self, tmp_path):
        check = one(run(make_config(tmp_path), "cuda"), "cuda")
        assert check.status is Status.SKIP and "no GPU" in check.detail
        check = one(run(make_config(tmp_path, "actor.device=cuda"), "cuda"), "cuda")
        assert check.status is Status.FAIL and "actor.device=cuda" in check.detail

    def test_placement_beyond_the_cluster_fails_naming_the_key(self, tmp_path):
        config = make_config(tmp_path, "cluster.devices_per_node=2", "cluster.component_placement={actor: 0-1, env: 5}")
        check = one(run(config, "placement"), "placement")
        assert check.status is Status.FAIL
        assert "cluster.component_placement.env" in check.detail and "outside the cluster" in check.detail

    def test_placement_that_fits_this_machine_passes(self, tmp_path):
        config = make_config(tmp_path, "cluster.devices_per_node=1", "cluster.component_placement={actor: 0, env: 0}")
        check = one(run(config, "placement"), "placement")
        assert check.status is Status.PASS and "node 0 has" in check.detail

    def test_more_cpu_slots_than_cores_warns(self, tmp_path):
        slots = psutil.cpu_count() * 2
        config = make_config(
            tmp_path,
            f"cluster.devices_per_node={slots}",
            f"cluster.component_placement={{actor: 0-{slots - 1}, env: 0}}",
            f"env.num_envs={slots}",
            f"algorithm.minibatch_size={slots}",
        )
        check = one(run(config, "placement"), "placement")
        assert check.status is Status.WARN, check
        assert f"uses {slots} CPU(s)" in check.detail

    def test_remote_nodes_without_a_ray_cluster_to_join_fail(self, tmp_path):
        config = make_config(
            tmp_path,
            "cluster.num_nodes=2",
            "cluster.devices_per_node=1",
            "cluster.component_placement={actor: 0, env: 1}",
        )
        check = one(run(config, "placement"), "placement")
        assert check.status is Status.FAIL and "cluster.ray_address" in check.detail


# ---- env reset + step -------------------------------------------------------------------------


class TestEnv:
    def test_reset_and_step_pass(self, tmp_path):
        check = one(run(make_config(tmp_path, "env.id=Pendulum-v1"), "env"), "env.reset_step")
        assert check.status is Status.PASS, check
        assert "observation shape (3,)" in check.detail and "Box(1,)" in check.detail

    def test_hanging_reset_is_reported_within_the_timeout_and_killed(self, tmp_path):
        config = make_config(tmp_path, "env.id=tests.doctor_envs:HangingResetEnv")
        start = time.monotonic()
        check = one(run(config, "env", env_timeout=5), "env.reset_step")
        elapsed = time.monotonic() - start
        assert 5 <= elapsed <= 5 + LOADED_HOST_MARGIN_S
        assert check.status is Status.FAIL
        # the time it had waited when it gave up: 5.0 s, or a little more on a loaded host (5.1 s in
        # a rehearsal), never less and never more than the whole check took
        said = re.search(r"still in env\.reset\(\) after (\d+\.\d) s \(timeout 5 s; killed\)", check.detail)
        assert said and 5.0 <= float(said.group(1)) <= round(elapsed, 1), check.detail
        assert "--env-timeout" in check.remedy
        assert not own_children()

    def test_failing_reset_passes_on_the_simulators_error(self, tmp_path):
        config = make_config(tmp_path, "env.id=tests.doctor_envs:BrokenResetEnv")
        check = one(run(config, "env"), "env.reset_step")
        assert check.status is Status.FAIL
        assert (
            "failed while in env.reset(): RuntimeError: scene asset 'house_living_room.usd' not found"
        ) in check.detail


# ---- output, exit codes, the command, the preflight ------------------------------------------


class TestOutput:
    def test_fast_json_shape_and_exit_code(self, tmp_path):
        code, document = doctor_json(make_config(tmp_path), fast=True, **LENIENT_DISK)
        assert code == OK == document["exit_code"] and document["ok"] is True
        assert document["fast"] is True
        assert set(document["counts"]) == {"pass", "fail", "warn", "skip"}
        names = [check["name"] for check in document["checks"]]
        assert names[:3] == ["ray.cluster", "disk.run_dir", "disk.ray_temp"]  # joined first (skipped: no ray_address)
        assert "env.reset_step" in names and "placement" in names
        assert not any(name.startswith(("gloo", "nccl", "network.reach")) for name in names)
        for check in document["checks"]:
            assert set(check) == {"name", "status", "ok", "detail", "remedy", "seconds"}
            assert check["status"] in {"pass", "warn", "skip"}

    def test_text_lines_and_fix_lines(self, tmp_path, monkeypatch):
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
        code, text = doctor(make_config(tmp_path, *TWO_ACTOR_RANKS), only=["network"])
        lines = text.splitlines()
        assert code == CHECK_FAILED
        failure = lines.index(next(line for line in lines if line.startswith("FAIL")))
        assert lines[failure].split()[:2] == ["FAIL", "network.GLOO_SOCKET_IFNAME"]
        assert lines[failure + 1].startswith("      fix: ")
        assert lines[-1].startswith("fleetrl doctor: NOT READY: 1 failed")

    def test_a_crashing_check_is_a_failure_not_a_traceback(self, tmp_path):
        broken = make_config(tmp_path)
        broken.env = None  # the env check cannot even read env.id
        code, document = doctor_json(broken, only=["env"])
        assert code == CHECK_FAILED
        (check,) = document["checks"]
        assert check["status"] == "fail" and "the env check crashed" in check["detail"]

    def test_command_parses_config_overrides_and_options(self, tmp_path, capsys):
        config_file = tmp_path / "config.yaml"
        config_file.write_text(f"runner:\n  run_dir: {tmp_path / 'runs'}\n")
        parser = add_doctor_arguments(argparse.ArgumentParser(prog="fleetrl doctor"))
        with closed_port() as holder:
            args = parser.parse_args(
                [
                    str(config_file),
                    "env.num_envs=4",
                    "--json",
                    "--only",
                    "reachability",
                    "--peer",
                    f"127.0.0.1:{holder.getsockname()[1]}",
                    "--connect-timeout",
                    "0.5",
                ]
            )
            assert command_doctor(args) == CHECK_FAILED
        document = json.loads(capsys.readouterr().out)
        assert [check["status"] for check in document["checks"]] == ["pass", "fail"]

    def test_preflight_is_quiet_when_ready_and_refuses_when_not(self, tmp_path, capsys, monkeypatch):
        lenient = DoctorOptions(**LENIENT_DISK)
        config = make_config(tmp_path, *TWO_ACTOR_RANKS)
        assert preflight(config, lenient) == OK
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == ""
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
        assert preflight(config, lenient) == CHECK_FAILED
        err = capsys.readouterr().err
        assert "FAIL  network.GLOO_SOCKET_IFNAME" in err and "--skip-doctor" in err


# ---- the `fleetrl` command ------------------------------------------------------------------------


def test_importing_the_doctor_is_cheap():
    """cli.py imports it at start-up: no torch, no Ray, no gymnasium until a check needs them."""
    code = "import sys, fleetrl.doctor; print([m for m in ('torch', 'ray', 'gymnasium') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_fleetrl_doctor_exit_codes(tmp_path):
    with closed_port() as holder:
        port = holder.getsockname()[1]
        result = fleetrl("doctor", "--json", "--only", "reachability", "--peer", f"127.0.0.1:{port}", timeout=120)
    assert result.code == CHECK_FAILED, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["exit_code"] == CHECK_FAILED
    assert fleetrl("doctor", "--only", "network", timeout=120).code == OK
    missing = fleetrl("doctor", str(tmp_path / "missing.yaml"), timeout=120)
    assert missing.code == 2 and "config file not found" in missing.stderr
