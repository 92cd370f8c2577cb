"""A pytest plugin for tests/test_promises.py (`-p tests.collected`): once collected, one line per
test — its node id and whether it is marked `slow` — so that a page naming tests can be checked
against what pytest really runs, in CI (`-m 'not slow'`) or not."""

from __future__ import annotations

import json

PREFIX = "COLLECTED "


def pytest_collection_finish(session):
    for item in session.items:
        print(PREFIX + json.dumps([item.nodeid, item.get_closest_marker("slow") is not None]), flush=True)
