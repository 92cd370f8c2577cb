"""A skip is the host's, never the product's, and CI takes only those it expects: a test that
needs a GPU (`needs("cuda", ...)`) skips on a host without one, with the need and the reason in
the summary, and where `FLEETRL_EXPECTED_SKIPS` does not name cuda that skip fails the session,
naming the test (tests/conftest.py). CI's own run (.ci/run) is the case where it is expected.
And no test module skips itself when an import fails: every package the tests import is a
declared test dependency, so a missing one is an error, never a quiet skip."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from tests.support import REPO, subprocess_env


@pytest.mark.needs("cuda", "a GPU to put a tensor on: the audit's example of a skip")
def test_a_tensor_moves_to_the_gpu_and_back():
    assert torch.arange(3, device="cuda").cpu().tolist() == [0, 1, 2]


@pytest.mark.needs("no_cuda", "a host where the GPU test above skips")
def test_a_skip_ci_does_not_expect_fails_the_session():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs"]
        + [f"{__file__}::test_a_tensor_moves_to_the_gpu_and_back"],
        cwd=REPO,
        env={**subprocess_env(), "FLEETRL_EXPECTED_SKIPS": "root"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout[-3000:]
    assert "1 skipped" in done.stdout and "needs cuda (a GPU to put a tensor on" in done.stdout, done.stdout[-3000:]
    section = done.stdout.split("skips this host was not expected to take (FLEETRL_EXPECTED_SKIPS=root)")[1]
    assert "test_skip_audit.py::test_a_tensor_moves_to_the_gpu_and_back: needs cuda" in section, done.stdout[-3000:]


def test_no_test_module_skips_itself_on_a_missing_import():
    skipping = [
        f"{path.relative_to(REPO)}: {match[0]}"
        for path in sorted((REPO / "tests").glob("*.py"))
        for match in re.finditer(r"importorskip\([^)]*\)", path.read_text())
        if path.name != "test_skip_audit.py"
    ]
    assert not skipping, "a declared test dependency is imported, never skipped on: " + "; ".join(skipping)
