"""The suite's own scheduling (tests/conftest.py): what it names must exist, or it orders nothing."""

from __future__ import annotations

from tests.conftest import LONGEST_FIRST
from tests.support import REPO


def test_every_module_collected_first_exists():
    missing = [name for name in LONGEST_FIRST if not (REPO / "tests" / name).is_file()]
    assert not missing, f"renamed or removed: {missing}; update LONGEST_FIRST in tests/conftest.py"
