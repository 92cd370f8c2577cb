"""What answering stack requests costs a worker: one heartbeat (record + JSON + TCPStore set)
against one heartbeat plus the stack-request check (`StackAnswerer` with nobody asking: one
`add(key, 0)`), interleaved in the same process over a real store; and, for scale, one answer
(every thread's stack formatted and stored) and one `ask_stacks` round trip to a beating worker
thread at the default 0.5 s interval.

    .venv/bin/python benchmarks/costs/stack_requests.py [--rounds 7] [--beats 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import per_call_us  # noqa: E402

SECRET = b"benchmark secret"  # the run's secret (probe/seal.py): every value is sealed with it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--beats", type=int, default=2000)
    args = parser.parse_args()

    from fleetrl.probe.flight_recorder import Recorder
    from fleetrl.probe.stack_requests import StackAnswerer, ask_stacks, connect_answerer
    from fleetrl.probe.store import HeartbeatStore, connect_publisher

    store = HeartbeatStore("127.0.0.1", SECRET)
    recorder = Recorder("env", 0, 0)
    publish = connect_publisher("127.0.0.1", store.port, "env", 0, SECRET)
    answer = connect_answerer("127.0.0.1", store.port, "env", 0, SECRET)

    def beat() -> None:
        publish(json.dumps(recorder.record()))

    def beat_and_check() -> None:
        beat()
        answer()

    plain, checked = [], []
    for _ in range(args.rounds):
        plain.append(per_call_us(beat, args.beats, clock=time.perf_counter))
        checked.append(per_call_us(beat_and_check, args.beats, clock=time.perf_counter))
    heartbeat, with_check = statistics.median(plain), statistics.median(checked)

    answering = StackAnswerer(store.sealed, "rollout", 0)
    answers = []
    for _ in range(args.rounds):
        store.sealed.add("fleetrl/stack-request/rollout/0", 1)
        started = time.perf_counter()  # one call, the request's: no warm-up call may answer it
        answering()
        answers.append((time.perf_counter() - started) * 1e6)
    recorder = Recorder("actor", 0, 0)
    recorder.start_publishing(
        connect_publisher("127.0.0.1", store.port, "actor", 0, SECRET),
        0.5,
        connect_answerer("127.0.0.1", store.port, "actor", 0, SECRET),
    )
    round_trips = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        assert ask_stacks(store.sealed, [("actor", 0)], 5.0)
        round_trips.append(time.perf_counter() - started)
    recorder.stop()

    print("| what | median of rounds |")
    print("|---|---|")
    print(f"| heartbeat (record + JSON + TCPStore set) | {heartbeat:.1f} µs |")
    print(f"| heartbeat + stack-request check | {with_check:.1f} µs |")
    print(f"| ratio (with check / without) | {with_check / heartbeat:.2f}x |")
    print(f"| one answer (stacks formatted + stored) | {statistics.median(answers):.0f} µs |")
    print(f"| ask_stacks round trip, 0.5 s heartbeat | {statistics.median(round_trips):.2f} s |")


if __name__ == "__main__":
    main()
