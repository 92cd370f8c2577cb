"""The incident response (fleetrl/watch/respond.py), exact and without a run: the first incident's
report is written — cause, summary, culprit, the detection and the end of the teardown, in that
order — the report hooks run each within its bound, the remote workers and every child process
are ended, and IncidentStop carries the report; a second caller waits for the first and raises
the same; with `exit_process` the process ends with exit 4 once all of that is done. Each case
runs in a process of its own (tests/respond_script.py): the response ends its process's children.
The in-process cases (what the mutation run sees) also read real processes' stacks: a worker's
faulthandler dump and py-spy's, py-spy's of the simulator server a stalled call waits on, and a
worker elsewhere's answer through a real heartbeat store; and a response that fails before its
report still stops later callers with the incident."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from fleetrl import exit_codes
from fleetrl.checkpoint import save_checkpoint
from fleetrl.probe.seal import Seal, SealedStore, run_secret
from fleetrl.probe.stack_requests import StackAsker, connect_answerer
from fleetrl.probe.store import HeartbeatStore
from fleetrl.probe.store_client import StoreClient
from fleetrl.watch.incident import Incident
from fleetrl.watch.reporting.hang_report import REPORT_JSON, REPORT_TEXT
from fleetrl.watch.respond import IncidentStop, Responder, runs_python, subprocess_stack
from tests.respond_script import WORKERS, incident
from tests.support import REPO, own_children, subprocess_env


def respond(tmp_path, case: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The script's run, and what it saw: {} where the response ended it before it could say."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.respond_script", str(tmp_path), case],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    children = json.loads(lines[0])["children"]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in children)
    return done, json.loads(lines[-1]) if len(lines) > 1 else {}


def report(tmp_path) -> dict:
    return json.loads((tmp_path / REPORT_JSON).read_text())


def test_the_response_writes_the_report_runs_the_hooks_ends_every_child_and_raises(tmp_path):
    done, seen = respond(tmp_path, "once")
    assert done.returncode == 0, done.stderr[-3000:]
    written = report(tmp_path)
    assert (written["cause"], written["culprit"], written["summary"]) == (
        "phase_timeout",
        ["env", 0],
        "env rank 0 is stuck",
    )
    assert written["detail"] == "its detail"
    assert 7.0 <= written["detected_after_s"] == written["reported_at"] - written["incident_started"] < 60
    assert written["reported_at"] <= written["ended_at"] <= seen["done_at"]
    assert written["ended_after_s"] == written["ended_at"] - written["reported_at"]
    assert [w["component"] for w in written["workers"]] == ["env", "actor"]
    text = (tmp_path / REPORT_TEXT).read_text()
    assert text.startswith("fleetrl stopped: phase_timeout\nenv rank 0 is stuck"), text[:300]
    assert text in done.stderr  # printed as well
    assert seen["hooks"] == [[str(tmp_path / REPORT_TEXT), str(tmp_path / REPORT_JSON)]]
    assert seen["remote_killed"] and seen["raised"] == "phase_timeout"
    assert seen["children_alive"] == [False, False]


def test_a_report_hook_that_hangs_is_left_behind_after_its_bound(tmp_path):
    done, seen = respond(tmp_path, "hanging_hook")
    assert done.returncode == 0, done.stderr[-3000:]
    assert seen["hooks"][1:] == ["after the hanging one"]  # the hooks after it still ran
    assert "did not finish within 0.5 s: exiting without it" in done.stderr
    assert seen["children_alive"] == [False, False] and seen["raised"] == "phase_timeout"
    written = report(tmp_path)
    assert 0.5 <= written["ended_at"] - written["reported_at"] < 30


def test_a_second_caller_waits_for_the_first_response_and_raises_its_report(tmp_path):
    done, seen = respond(tmp_path, "two_callers")
    assert done.returncode == 0, done.stderr[-3000:]
    assert seen["second"]["cause"] == "phase_timeout"  # the first incident's report, not its own
    assert report(tmp_path)["cause"] == "phase_timeout"
    assert done.stderr.count("fleetrl stopped:") == 1


def test_the_watchdog_s_response_ends_its_process_with_exit_4_after_the_teardown(tmp_path):
    done, seen = respond(tmp_path, "exit_process")
    assert done.returncode == exit_codes.INCIDENT, done.stderr[-3000:]
    assert seen == {}  # nothing after the response ran
    written = report(tmp_path)
    assert written["cause"] == "phase_timeout" and written["ended_at"] >= written["reported_at"]
    assert "fleetrl stopped: phase_timeout" in done.stderr


def test_in_this_process_the_response_ends_what_this_process_started(tmp_path, capsys, caplog):
    """The in-process form (a `Trainer` used as a library watches itself): the children this test
    started are ended, the report written (with the teardown's end), printed and logged, each hook
    run in a daemon thread of its own name (what a stack dump shows) and one that hangs left behind
    after its bound with a warning naming it, IncidentStop raised with the cause and summary. (This
    process's own helpers, such as multiprocessing's resource tracker, which the response would end
    too, are started again on demand.) The mutation run's test of the response: mutmut sees which
    functions a test reaches in this process only, not in tests/respond_script.py's."""
    assert own_children() == []  # the response ends every child of this process
    children = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    responder, hooked, threads, release = Responder(tmp_path), [], [], threading.Event()

    def hanging_hook(paths):
        threads.append(threading.current_thread())
        release.wait(60)

    responder.add_report_hook(hooked.append, 5.0)
    responder.add_report_hook(hanging_hook, 0.3)
    with caplog.at_level(logging.WARNING, logger="fleetrl"), pytest.raises(IncidentStop) as stop:
        responder.respond(incident(), WORKERS)
    release.set()
    assert [psutil.pid_exists(child.pid) for child in children] == [False, False]  # killed and reaped
    written = report(tmp_path)
    assert stop.value.report["cause"] == "phase_timeout" == written["cause"]
    assert str(stop.value) == "phase_timeout: env rank 0 is stuck"
    assert written["reported_at"] <= written["ended_at"]
    text = (tmp_path / REPORT_TEXT).read_text()
    assert text in capsys.readouterr().err
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.module == "respond"] == [
        (logging.ERROR, f"phase_timeout: env rank 0 is stuck (report: {tmp_path / REPORT_TEXT})"),
        (logging.WARNING, f"a report hook ({hanging_hook}) did not finish within 0.3 s: exiting without it"),
    ]
    assert hooked == [[tmp_path / REPORT_TEXT, tmp_path / REPORT_JSON]] and responder.done.is_set()
    assert [(t.name, t.daemon) for t in threads] == [("fleetrl-report-hook", True)]
    with pytest.raises(IncidentStop) as again:  # a later caller gets the same report
        responder.respond(incident(), WORKERS)
    assert again.value.report is stop.value.report


def simulator_server(tmp_path) -> tuple[subprocess.Popen, str]:
    """tests/sim_server.py serving (asleep in `serve_forever`), and the command line its worker publishes."""
    server = subprocess.Popen(
        [sys.executable, "tests/sim_server.py", tmp_path, "0", "answer"], cwd=REPO, stdout=subprocess.PIPE
    )
    assert server.stdout.readline() == b"ready\n"  # in serve_forever from here on
    return server, f"{sys.executable} tests/sim_server.py {tmp_path} 0 answer"


def test_a_subprocess_s_stack_is_read_by_py_spy_where_its_command_line_is_the_one_published(tmp_path):
    """A stalled call's subprocess (watch/respond.py `subprocess_stack`): a Python one's stack read
    from outside; a pid whose command line is not the published one (another machine's pid, or
    reused here), a pid that is gone: each says so; a process that is not Python, named by a
    command line that is not UTF-8 (a Latin-1 file name, read with a replacement character as its
    worker publishes it), says that; a Python process with such a command line, which py-spy cannot
    read, says that py-spy could not read it."""
    server, command = simulator_server(tmp_path)
    latin_1 = tmp_path / os.fsdecode(b"caf\xe9.log")
    latin_1.touch()
    follower = subprocess.Popen(["tail", "-f", latin_1])
    waits = "import time; print('ready', flush=True); time.sleep(600)"
    python_latin_1 = subprocess.Popen([sys.executable, "-c", waits, latin_1], stdout=subprocess.PIPE)
    assert python_latin_1.stdout.readline() == b"ready\n"
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        stack = subprocess_stack(server.pid, command)
        assert stack.startswith(f"Process {server.pid}: {command}\n"), stack
        assert "serve_forever (tests/sim_server.py:" in stack, stack
        another = command.replace(" answer", " never")  # another server's, say, whose pid this one now has
        assert subprocess_stack(server.pid, another) == "(not on this machine, or gone)"
        assert subprocess_stack(gone.pid, "true") == "(not on this machine, or gone)"
        published = f"tail -f {tmp_path}/caf\ufffd.log"
        assert subprocess_stack(follower.pid, published) == "(no Python stack: not a Python process)"
        # py-spy 0.4.2 cannot read a Python process with such a command line: that, not "not Python"
        published = f"{sys.executable} -c {waits} {tmp_path}/caf\ufffd.log"
        assert subprocess_stack(python_latin_1.pid, published) == "(no Python stack: py-spy could not read it)"
    finally:
        for process in (server, follower, python_latin_1):
            process.kill()
            process.wait()


def test_a_python_interpreter_is_told_by_its_executable_or_by_the_libpython_it_maps(tmp_path):
    """`runs_python`: this interpreter (its executable named python3.x); the same interpreter under
    another name (as a simulator embedding Python is), by the libpython it maps; a program named
    python3 that maps no libpython, by its name (a statically linked interpreter, as Debian's
    /usr/bin/python3 and python-build-standalone's are: here `sleep` under that name stands for
    one, which not every host has); `tail`, neither; a pid that is gone, not. (This interpreter
    maps libpython, as pyenv's does.)"""
    assert b"libpython" in Path(f"/proc/{os.getpid()}/maps").read_bytes(), "a statically linked interpreter"
    embedding, static = tmp_path / "sim", tmp_path / "python3"
    shutil.copy(os.path.realpath(sys.executable), embedding)
    shutil.copy(shutil.which("sleep"), static)
    waits = "import time; print('ready', flush=True); time.sleep(600)"
    renamed = subprocess.Popen([embedding, "-c", waits], stdout=subprocess.PIPE)
    named = subprocess.Popen([static, "600"])
    follower = subprocess.Popen(["tail", "-f", "/dev/null"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        assert renamed.stdout.readline() == b"ready\n"
        assert os.path.basename(os.readlink(f"/proc/{renamed.pid}/exe")) == "sim"
        assert b"libpython" not in Path(f"/proc/{named.pid}/maps").read_bytes()
        pids = (os.getpid(), renamed.pid, named.pid, follower.pid, gone.pid)
        assert [runs_python(pid) for pid in pids] == [True, True, True, False, False]
    finally:
        for process in (renamed, named, follower):
            process.kill()
            process.wait()


def test_a_py_spy_that_does_not_answer_is_given_up_on_within_its_bound(tmp_path, monkeypatch):
    """py-spy's read of a stalled call's subprocess is bounded (SUBPROCESS_STACK_TIMEOUT_S, within
    the teardown's promise): one that does not answer within it (here a stand-in, first on PATH,
    that sleeps 30 s and then says nothing) is ended and the stack said to have timed out, and the
    response goes on."""
    stand_in = tmp_path / "py-spy"
    stand_in.write_text("#!/bin/sh\nexec sleep 30\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    command = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    assert subprocess_stack(os.getpid(), command.strip()) == "(py-spy timed out)"


# A worker's process as the response sees it: its stacks dumped on SIGUSR1 into the run's stacks folder
ACTOR_PROCESS = (
    "import pathlib, sys, time; from fleetrl.probe.stacks import register_stack_dump; "
    "register_stack_dump(pathlib.Path(sys.argv[1])); print('ready', flush=True); time.sleep(600)"
)


def test_in_this_process_the_report_has_each_worker_s_stack_what_the_call_waits_on_and_the_newest_checkpoint(
    tmp_path,
):
    """The in-process response with a stalled call's subprocesses (the first two have their stacks
    read; a third is only named), a worker on another machine (its record says so: named, not
    signalled), a worker here whose faulthandler writes its stacks into the run's stacks folder,
    and three checkpoints, the newest named."""
    for iteration in (4, 8, 12):
        save_checkpoint(tmp_path, iteration, {"iteration": iteration}, keep=3)
    server, command = simulator_server(tmp_path)
    actor = subprocess.Popen(
        [sys.executable, "-c", ACTOR_PROCESS, tmp_path / "stacks" / "actor-1.txt"],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
    )
    assert actor.stdout.readline() == b"ready\n"
    waited = {"pid": server.pid, "command": command, "state": "S", "cpu": 0.0}
    records = {
        ("env", 0): {"pid": 1, "machine": "another-machine", "host": "far-host", "phase": "env.step"},
        ("actor", 1): {"pid": actor.pid, "phase": "actor.train"},
    }
    waits_on = [waited, {**waited, "command": "other"}, dict(waited)]
    stalled = Incident("phase_timeout", "stuck", time.time() - 7.0, ("env", 0), records=records, waits_on=waits_on)
    try:
        with pytest.raises(IncidentStop):
            Responder(tmp_path).respond(stalled, WORKERS)
    finally:  # the response ends them; a test that failed before it must too
        for process in (server, actor):
            process.kill() if process.poll() is None else None
    assert [psutil.pid_exists(process.pid) for process in (server, actor)] == [False, False]
    written = report(tmp_path)
    assert written["newest_checkpoint"] == str(tmp_path / "checkpoints" / "ckpt_00000012.pt")
    stacks = {(w["component"], w["rank"]): w["stack"] for w in written["workers"]}
    assert stacks[("env", 0)] == (
        "(did not answer through the heartbeat store, and it runs on far-host, not on this machine: "
        "its pid cannot be signalled from here)"
    )
    faulthandler_s, native = stacks[("actor", 1)].split("\n--- py-spy (native) ---\n")
    assert re.fullmatch(
        r'Current thread 0x[0-9a-f]+ \(most recent call first\):\n  File "<string>", line 1 in <module>\n*',
        faulthandler_s,
    ), faulthandler_s
    assert native.startswith(f"Process {actor.pid}: "), native
    first, second, third = written["waits_on"]
    assert "serve_forever (tests/sim_server.py:" in first["stack"], first
    assert (second["stack"], "stack" in third) == ("(not on this machine, or gone)", False)


# A worker on another machine as the response sees it: only the heartbeat store reaches it
ELSEWHERE = {("env", 0): {"pid": 1, "machine": "another-machine", "host": "far-host", "phase": "env.step"}}
FAR_WORKERS = [{"component": "env", "rank": 0, "node": 1}]


def far_incident(cause: str = "phase_timeout", summary: str = "env rank 0 is stuck") -> Incident:
    return Incident(cause, summary, time.time() - 7.0, ("env", 0), records=ELSEWHERE)


def test_in_this_process_a_worker_elsewhere_answers_with_its_stacks_through_the_heartbeat_store(tmp_path):
    """The response asks its workers for their stacks through the heartbeat store (`ask_stacks`,
    set once the store is open): a worker on another machine, which no signal reaches, answers
    from its own heartbeat thread (here a thread of this process, on its own connection to a real
    store), and its answer is its stack in the report."""
    secret = run_secret()
    store = HeartbeatStore("127.0.0.1", secret)
    answerer = connect_answerer("127.0.0.1", store.port, "env", 0, secret)
    stop = threading.Event()

    def beats():
        while not stop.wait(0.05):
            answerer()

    thread = threading.Thread(target=beats, name="fleetrl-heartbeat")
    thread.start()
    responder = Responder(tmp_path)
    responder.ask_stacks = StackAsker(store.sealed, 30.0)
    try:
        with pytest.raises(IncidentStop):
            responder.respond(far_incident(), FAR_WORKERS)
    finally:
        stop.set()
        thread.join()
        answerer.store.store.close()
    (worker,) = report(tmp_path)["workers"]
    assert worker["stack"].startswith("Thread "), worker["stack"]
    assert "in test_in_this_process_a_worker_elsewhere_answers_with_its_stacks_through" in worker["stack"]
    assert '"fleetrl-heartbeat" (taking these stacks)' in worker["stack"]


def test_a_response_that_fails_before_its_report_still_stops_every_later_caller_with_the_incident(tmp_path):
    """The response fails while taking the stacks (its connection to the heartbeat store is
    closed): the failure reaches its caller, no report is written, and a later caller (the main
    thread, after the watchdog's) raises IncidentStop with the first incident's cause and summary."""
    secret = run_secret()
    store = HeartbeatStore("127.0.0.1", secret)
    lost = StoreClient("127.0.0.1", store.port)
    lost.close()
    responder = Responder(tmp_path)
    responder.ask_stacks = StackAsker(SealedStore(lost, Seal(secret)), 30.0)
    with pytest.raises(OSError) as failed:
        responder.respond(far_incident(), FAR_WORKERS)
    assert failed.value.errno == errno.EBADF, failed.value
    assert not (tmp_path / REPORT_JSON).exists() and responder.done.is_set()
    with pytest.raises(IncidentStop) as later:
        responder.respond(far_incident("worker_died", "another"), FAR_WORKERS)
    assert later.value.report == {"cause": "phase_timeout", "summary": "env rank 0 is stuck"}
    assert str(later.value) == "phase_timeout: env rank 0 is stuck"
