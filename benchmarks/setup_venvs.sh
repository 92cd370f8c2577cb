#!/usr/bin/env bash
# Create the isolated comparison venvs used by benchmarks/compare/ppo_cartpole.py.
#
#   benchmarks/.venvs/sb3      stable-baselines3 2.9.2 + gymnasium 1.x + torch 2.13.0 (CPU)
#   benchmarks/.venvs/cleanrl  cleanrl 1.2.0 (PyPI, --no-deps) + what its ppo.py imports
#                              (+ with the `atari` target: what its ppo_atari.py imports, for
#                              benchmarks/compare/atari_throughput.py)
#   benchmarks/.venvs/lerobot  lerobot 0.4.4 on its own pins, and lerobot 0.3.3 unpacked beside it
#                              (`lerobot` target only: LeRobot's own dataset readers and writers,
#                              v3.0 and v2.1, for benchmarks/compare/lerobot_datasets.py)
#
# torch is ALWAYS pinned to 2.13.0: that is the CPU wheel lying on local disk
# (pip's find-links); an unpinned torch would pull a multi-GB CUDA build.
#
# Notes on cleanrl 1.2.0 (the latest release on PyPI, 2023-05):
#   * it declares Requires-Python <3.11, so it is installed with
#     --ignore-requires-python --no-deps onto Python 3.11 (torch 2.13.0 CPU only
#     exists here as a cp311 wheel). Its ppo.py runs fine on 3.11.
#   * its cleanrl/ppo.py is the pre-gymnasium version: it imports `gym` (0.23.1
#     API: env.seed(), 4-tuple step, list-of-dict vector infos), uses argparse
#     (not tyro) and `distutils.util.strtobool`, and logs via
#     torch.utils.tensorboard. So the venv gets gym==0.23.1 (the version pinned
#     in cleanrl 1.2.0's own metadata), numpy<2 (gym 0.23 predates numpy 2),
#     tensorboard<3, torch==2.13.0, and pygame (gym 0.23.1's cartpole.py imports
#     it at module level; cleanrl pins pygame==2.1.0, which has no cp311 wheel,
#     so the first release with one, >=2.1.3, is used). No gymnasium / tyro
#     are needed by ppo.py.
#
# Usage: bash benchmarks/setup_venvs.sh [sb3|cleanrl|atari|lerobot ...]   (default: sb3 cleanrl)
# Re-running is idempotent (existing venvs are reused, pins re-applied).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
mkdir -p "$VENVS"

TORCH_PIN="torch==2.13.0"

# pip install, quiet; drops the harmless "Location file:///opt/pypi... is ignored" noise
pipi() {
    local py="$1"; shift
    "$py" -m pip install --quiet "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

mkvenv() {
    local dir="$1"
    if [ ! -x "$dir/bin/python" ]; then
        "$PY" -m venv "$dir"
    fi
    pipi "$dir/bin/python" --upgrade "pip<27" "setuptools<81" wheel
}

setup_sb3() {
    local v="$VENVS/sb3"
    echo "== sb3 venv: $v"
    mkvenv "$v"
    pipi "$v/bin/python" "$TORCH_PIN"
    pipi "$v/bin/python" "$TORCH_PIN" "stable-baselines3==2.9.2" "gymnasium==1.4.0"
    "$v/bin/python" - <<'EOF'
import torch, gymnasium, stable_baselines3, numpy
print("sb3 venv ok: torch", torch.__version__, "| stable-baselines3", stable_baselines3.__version__,
      "| gymnasium", gymnasium.__version__, "| numpy", numpy.__version__)
assert torch.__version__.startswith("2.13.0"), torch.__version__
EOF
}

setup_cleanrl() {
    local v="$VENVS/cleanrl"
    echo "== cleanrl venv: $v"
    mkvenv "$v"
    pipi "$v/bin/python" "$TORCH_PIN"
    # gym 0.23.1 is an sdist; setuptools<81 keeps its setup.py buildable.
    pipi "$v/bin/python" "$TORCH_PIN" "numpy<2" "gym==0.23.1" "tensorboard<3" "pygame>=2.1.3,<3"
    pipi "$v/bin/python" --no-deps --ignore-requires-python "cleanrl==1.2.0"
    "$v/bin/python" - <<'EOF'
import importlib.util, os, torch, gym, numpy
spec = importlib.util.find_spec("cleanrl")
ppo = os.path.join(list(spec.submodule_search_locations)[0], "ppo.py")
assert os.path.isfile(ppo), f"cleanrl ppo.py missing: {ppo}"
import tensorboard
from importlib.metadata import version
print("cleanrl venv ok: torch", torch.__version__, "| cleanrl", version("cleanrl"), "| gym", gym.__version__,
      "| numpy", numpy.__version__, "| tensorboard", tensorboard.__version__)
print("cleanrl ppo.py:", ppo)
assert torch.__version__.startswith("2.13.0"), torch.__version__
EOF
}

# ppo_atari.py (cleanrl 1.2.0) imports the Atari wrappers of stable-baselines3 1.2.0 (the version
# cleanrl pins; the gym-0.23 API, installed --no-deps: SB3 1.2 asks for gym 0.19) and OpenCV, and
# makes its envs with gym 0.23. Its Atari extra's ale-py 0.7.4 has no Python 3.11 wheel and
# fetches ROMs at install time, so the emulator is ale-py 0.12 (ROMs in the wheel) on Gymnasium 1.4, as
# fleetrl runs it, put behind gym 0.23's API by benchmarks/compare/jobs/cleanrl_atari.py.
setup_cleanrl_atari() {
    setup_cleanrl
    local v="$VENVS/cleanrl"
    echo "== cleanrl venv, Atari: $v"
    pipi "$v/bin/python" --no-deps "stable-baselines3==1.2.0"
    pipi "$v/bin/python" "$TORCH_PIN" "numpy<2" "cloudpickle" "pandas<3" "matplotlib<4" \
        "opencv-python-headless>=4.9,<4.11" "ale-py>=0.12,<0.13" "gymnasium==1.4.0"
    "$v/bin/python" - <<'EOF'
import ale_py, cv2, gym, gymnasium, numpy, stable_baselines3
from stable_baselines3.common.atari_wrappers import EpisodicLifeEnv, FireResetEnv  # noqa: F401
print("cleanrl atari ok: stable-baselines3", stable_baselines3.__version__, "| ale-py", ale_py.__version__,
      "| opencv", cv2.__version__, "| gym", gym.__version__, "| gymnasium", gymnasium.__version__,
      "| numpy", numpy.__version__)
EOF
}

# lerobot 0.4.4 (the newest release this PyPI serves) reads and writes LeRobotDataset v3.0. It
# pins torch<2.11, so its venv is its own and its torch is PyPI's (a CUDA build of a few GB,
# downloaded once), not the local 2.13.0. Version 2.1, which most published datasets still use,
# is written by lerobot 0.3.3's LeRobotDataset: its wheel goes, without dependencies, into
# lerobot-0.3.3/ beside the venv, which the scripts that need it put first on PYTHONPATH over
# the 0.4.4 venv's packages (0.3.3's own pins, torch<2.8 and gymnasium<1, would take a second
# CUDA torch; its dataset writer runs on the newer packages, as benchmarks/compare/lerobot_datasets.py checks).
setup_lerobot() {
    local v="$VENVS/lerobot"
    echo "== lerobot venv: $v"
    mkvenv "$v"
    pipi "$v/bin/python" "lerobot==0.4.4"
    rm -rf "$v/lerobot-0.3.3"
    # with the `datasets` release it was made for (<=3.6: its reader stacks columns that 4.x returns
    # as Column objects) and the jsonlines it writes v2.1's tables with
    pipi "$v/bin/python" --no-deps --target "$v/lerobot-0.3.3" "lerobot==0.3.3" "datasets==3.6.0" "jsonlines>=4,<5"
    "$v/bin/python" - <<'EOF'
import av, datasets, torch
from importlib.metadata import version
print("lerobot venv ok: lerobot", version("lerobot"), "| torch", torch.__version__, "| datasets",
      datasets.__version__, "| av", av.__version__)
assert version("lerobot") == "0.4.4", version("lerobot")
EOF
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(sb3 cleanrl)
for t in "${targets[@]}"; do
    case "$t" in
        sb3) setup_sb3 ;;
        cleanrl) setup_cleanrl ;;
        atari) setup_cleanrl_atari ;;
        lerobot) setup_lerobot ;;
        *) echo "unknown venv: $t (expected sb3, cleanrl, atari or lerobot)" >&2; exit 2 ;;
    esac
done
