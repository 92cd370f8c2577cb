"""Shared fixtures: every test must end every process it starts. And what a test needs of its host
(`@pytest.mark.needs(need, why)`: root, namespaces, cuda, ...): a test whose need this host lacks
(tests/support.py `host_lacks`, the tests' own probe) is skipped with the need and the reason in
its message, which `-rs` prints; where `FLEETRL_EXPECTED_SKIPS` is set (CI: .ci/run names the
needs its reference host lacks), any other skip fails the session, naming the test."""

from __future__ import annotations

import logging
import os

import pytest

from tests.support import end_leftovers, host_lacks, own_children

EXPECTED_SKIPS = "FLEETRL_EXPECTED_SKIPS"  # space-separated needs this host is known to lack


def pytest_configure(config):
    if EXPECTED_SKIPS in os.environ and not hasattr(config, "workerinput"):  # the session's controller
        config.pluginmanager.register(SkipAudit(os.environ[EXPECTED_SKIPS].split()), "fleetrl-skip-audit")
    configure_ray_token(config)


def configure_ray_token(config):
    """In the process that starts the test workers (pyproject's addopts: three), before they start:
    Ray's default token (~/.ray/auth_token), which every new local cluster uses and the first one
    to start writes where none exists. Two first clusters starting at once in two workers
    would each write their own, and one cluster's processes would then read the other's token."""
    if hasattr(config, "workerinput"):  # a worker: its controller has done it
        return
    from ray._private.authentication.authentication_token_setup import generate_and_save_token
    from ray._raylet import AuthenticationTokenLoader

    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        generate_and_save_token()


def pytest_collection_modifyitems(config, items):
    for item in items:
        for mark in item.iter_markers("needs"):
            need, why = mark.args
            lacking = host_lacks(need)
            if lacking is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} ({why}): {lacking}"))


class SkipAudit:
    """Collects the session's skips (from every xdist worker's reports) and fails the session for
    any this host was not expected to take."""

    def __init__(self, expected: list[str]):
        self.expected = expected
        self.unexpected: list[str] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        if not report.skipped or getattr(report, "wasxfail", None) is not None:
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if not any(reason.startswith(f"needs {need} (") for need in self.expected):
            self.unexpected.append(f"{report.nodeid}: {reason}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.unexpected and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        if self.unexpected:
            terminalreporter.section(
                f"skips this host was not expected to take ({EXPECTED_SKIPS}={' '.join(self.expected)})"
            )
            for line in self.unexpected:
                terminalreporter.line(line)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The tests' tensors are tiny; with torch's default of one thread per core, each op pays an
    OpenMP fork/join that costs milliseconds on a busy 2-core machine (100x the op itself).
    fleetrl's own processes set their thread count from runner.torch_threads."""
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def tiny_paligemma(tmp_path_factory):
    """A tiny randomly initialised PaliGemma folder, as `fleetrl init-model` writes it."""
    from fleetrl.models.hf.init_model import init_model

    return init_model("paligemma", "tiny", tmp_path_factory.mktemp("models") / "paligemma-tiny")


@pytest.fixture(scope="session")
def tiny_smolvlm(tmp_path_factory):
    """A tiny randomly initialised SmolVLM (Idefics3) folder, as `fleetrl init-model` writes it."""
    from fleetrl.models.hf.init_model import init_model

    return init_model("smolvlm", "tiny", tmp_path_factory.mktemp("models") / "smolvlm-tiny")


@pytest.fixture(scope="session")
def published(tmp_path_factory):
    """`published(name)`: a folder of a family built by transformers from its published
    configuration (tests/hf_families.py: paligemma, paligemma2, smolvlm, smolvlm2, qwen2_vl,
    qwen2_5_vl), made once per session."""
    from tests.hf_families import build

    made: dict = {}

    def folder(name: str):
        if name not in made:
            made[name] = build(name, tmp_path_factory.mktemp("published") / name)
        return made[name]

    return folder


@pytest.fixture(scope="session")
def panda_demos(tmp_path_factory):
    """Two of the scripted expert's episodes of `PandaTasks` (32×32, 8 steps: support.PANDA_SFT_ENV),
    recorded as `fleetrl record` does, once per session."""
    from fleetrl.config.schema import EnvConfig
    from fleetrl.envs.recorder import record
    from tests.support import PANDA_ENV, PANDA_SFT_ENV

    out = tmp_path_factory.mktemp("demos") / "panda"
    record(EnvConfig(id=PANDA_ENV, kwargs=PANDA_SFT_ENV), 2, out)
    return out


@pytest.fixture(autouse=True, scope="session")
def no_leftover_processes_at_exit():
    """Catches what module- and session-scoped fixtures started and did not end."""
    yield
    end_leftovers(own_children(), "the test session")


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail any test that leaves a child process of the test process alive. Processes that were
    already running when the test started belong to wider-scoped fixtures (a module's shared
    cluster, say) and are checked when the session ends instead."""
    before = {p.pid for p in own_children()}
    yield
    end_leftovers([p for p in own_children() if p.pid not in before], "test")


@pytest.fixture(autouse=True)
def environment_restored():
    """Undo what a test's in-process run wrote into this process's environment (a loopback Ray
    run's RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, a Gloo run's GLOO_SOCKET_IFNAME, a run token): every
    later test's subprocess would inherit it and run on a different machine than its own test says."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture
def quiet_fleetrl_logging():
    """`Trainer` attaches handlers to the 'fleetrl' loggers (stderr and the run's train.log);
    close them after an in-process training test so no file stays open into the next test."""
    yield
    for name in ("fleetrl", "fleetrl.iterations", "fleetrl.console"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
