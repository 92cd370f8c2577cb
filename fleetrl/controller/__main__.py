"""The controller process of a supervised run: `python -m fleetrl.controller`, started by
`fleetrl train`'s supervisor (supervise/supervisor.py) with its `Orders` (orders.py) pickled on stdin.

It runs the training loop (loop.py, `Trainer`) and nothing else: it beats into the supervisor's
store from its first instant, dies with the supervisor (parent-death signal), and exits (fleetrl/
exit_codes.py) OK when training is done, USER_ERROR on a user error (the message printed), or
`stopped_by` the stop signal the supervisor forwarded once it has been honoured (checkpoint
saved). Incidents go to the supervisor, which reports them and ends this process.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import pickle
import signal
import sys
from datetime import timedelta
from pathlib import Path

from fleetrl import exit_codes
from fleetrl.cluster.ray.early_start import close_early, start_early
from fleetrl.controller.orders import Orders
from fleetrl.probe.recorded_calls import WatchSpec, start_watching

PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; if the parent is already gone, exit now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(exit_codes.ERROR)


def main() -> int:
    orders: Orders = pickle.load(sys.stdin.buffer)
    die_with(orders.supervisor_pid)
    faulthandler.enable()  # a crash (an inline simulator's segfault) prints its Python stack: its last words
    start_early(orders.plan.config.cluster)  # Ray's daemons start while this process imports and checks
    from torch.distributed import TCPStore

    from fleetrl import signals
    from fleetrl.controller.loop import Trainer
    from fleetrl.errors import UserError
    from fleetrl.probe.seal import Seal, SealedStore, run_secret
    from fleetrl.watch.respond import IncidentStop
    from fleetrl.watch.supervised import SupervisedSession

    config = orders.plan.config
    secret = run_secret()  # handed down by the supervisor
    stacks = str(Path(orders.run_dir) / "stacks")
    host = orders.store_host
    spec = WatchSpec(host, orders.store_port, config.watchdog.heartbeat_interval_s, stacks, {}, secret)
    recorder = start_watching(orders.component, 0, 0, spec)
    client = TCPStore(host, orders.store_port, is_master=False, timeout=timedelta(seconds=10))
    store = SealedStore(client, Seal(secret))
    signals.install_stop_handlers()
    try:
        with recorder.in_phase("startup"):
            session = SupervisedSession(config, Path(orders.run_dir), store, spec, recorder)
            trainer = Trainer(orders.plan, run_dir=Path(orders.run_dir), session=session, restart=orders.restart)
        trainer.train()
        return exit_codes.OK
    except UserError as error:
        print(f"fleetrl: {error}", file=sys.stderr)
        return exit_codes.USER_ERROR
    except KeyboardInterrupt as interrupt:  # the supervisor forwarded Ctrl-C / SIGTERM: checkpoint saved
        return signals.exit_code(interrupt)
    except IncidentStop:
        return exit_codes.INCIDENT
    finally:
        close_early()  # a config error stopped the run before its backend took the instance
        recorder.stop()


if __name__ == "__main__":
    code = main()
    # Exit at once: the supervisor reads a silence after the last heartbeat as a freeze, and an
    # interpreter's teardown (torch, Ray's atexit hooks) can take seconds; everything is closed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
