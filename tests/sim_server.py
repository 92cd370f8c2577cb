"""A simulator's server process (run as a script, `python tests/sim_server.py PID_DIR COMPUTE_S
ANSWER`): it writes its pid into PID_DIR (so a test can tell whether it outlived the run), computes
for COMPUTE_S CPU seconds (a scene loading; never more than three times that in wall time), then,
if ANSWER is `answer`, writes `ready` to its stdout — the pipe its simulator reads — and serves
(sleeps) until it is killed."""

from __future__ import annotations

import os
import sys
import time


def load_scene(compute_s: float) -> None:
    spent = time.process_time() + compute_s  # CPU seconds: a loaded host's steal is not work
    deadline = time.monotonic() + 3 * compute_s
    while time.process_time() < spent and time.monotonic() < deadline:
        sum(range(1_000))


def serve_forever() -> None:
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    pid_dir, compute_s, answer = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "answer"
    with open(os.path.join(pid_dir, str(os.getpid())), "w"):
        pass
    load_scene(compute_s)
    if answer:
        os.write(1, b"ready\n")
    serve_forever()
