"""Runs CleanRL's own, unmodified `cleanrl/ppo.py` from the installed cleanrl 1.2.0 package
(inside benchmarks/.venvs/cleanrl) and adds only out-of-band hooks around it:

* before the script starts, its heavy imports (torch, gym, tensorboard) are done here and a
  line `@@READY <time.time()> <torch threads>` is printed, so the parent can time start-up
  apart from training;
* the script runs via runpy.run_path(ppo.py, run_name="__main__") with its own argv;
* on SIGUSR1 (sent by the parent the moment the script's own stdout log shows the last-100
  mean return reaching the target) the handler takes the script's live `agent` from its
  module globals, plays --eval-episodes deterministic (argmax) episodes, writes the result
  to --out and exits the process. cleanrl 1.2.0's ppo.py has no --save-model option, so
  this is the only way to evaluate its policy without editing its code. If the script ends by
  itself (target never reached within --total-timesteps) the final agent is evaluated the
  same way.

Usage: python cleanrl_ppo.py --out EVAL.json [--eval-episodes 100] -- <ppo.py arguments>
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import runpy
import signal
import sys
import time
import warnings

warnings.filterwarnings("ignore")  # gym 0.23 / distutils deprecation noise on Python 3.11

import gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from episode_returns import summarize_returns  # noqa: E402 - a module beside this script
from torch.utils.tensorboard import SummaryWriter  # noqa: E402,F401  (pre-import: start-up)


def ppo_path() -> str:
    spec = importlib.util.find_spec("cleanrl")
    return os.path.join(list(spec.submodule_search_locations)[0], "ppo.py")


def evaluate(script_globals: dict, episodes: int, seed: int) -> dict:
    started = time.perf_counter()
    agent = script_globals["agent"]
    env = gym.make(script_globals["args"].env_id)  # gym 0.23.1 CartPole-v1: TimeLimit 500
    env.seed(seed)
    returns = []
    with torch.no_grad():
        for _ in range(episodes):
            obs, done, total = env.reset(), False, 0.0
            while not done:
                logits = agent.actor(torch.as_tensor(np.asarray(obs), dtype=torch.float32))
                obs, reward, done, _ = env.step(int(logits.argmax()))
                total += float(reward)
            returns.append(total)
    env.close()
    return summarize_returns(returns, started)


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--eval-seed", type=int, default=10_000)
    own = parser.parse_args(argv[:split])
    script_argv = argv[split + 1 :]
    path = ppo_path()

    def finish(script_globals: dict, how: str) -> None:
        t_stop = time.time()
        result = {
            "stopped_by": how,
            "t_stop": t_stop,
            "global_step": int(script_globals.get("global_step", 0)),
            "torch_threads": torch.get_num_threads(),
            "ppo_path": path,
        }
        try:
            result["eval"] = evaluate(script_globals, own.eval_episodes, own.eval_seed)
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            result["eval"] = None
            result["eval_error"] = repr(error)
        with open(own.out, "w") as f:
            json.dump(result, f, indent=2)

    def on_target(signum, frame):
        while frame is not None and "agent" not in frame.f_globals:
            frame = frame.f_back
        if frame is None:
            with open(own.out, "w") as f:
                json.dump(
                    {
                        "stopped_by": "signal",
                        "eval": None,
                        "eval_error": "signal arrived before the script built its agent",
                    },
                    f,
                )
        else:
            finish(frame.f_globals, "signal")
        sys.stdout.flush()
        os._exit(0)

    signal.signal(signal.SIGUSR1, on_target)
    print(f"@@READY {time.time():.6f} {torch.get_num_threads()}", flush=True)
    sys.argv = [path, *script_argv]
    script_globals = runpy.run_path(path, run_name="__main__")
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    finish(script_globals, "end")


if __name__ == "__main__":
    main()
