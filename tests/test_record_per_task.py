"""`fleetrl record --per-task --task-episodes TASK=N,...`: unequal demonstration counts per task, on
real Meta-World (its scripted policies, MuJoCo's physics).

A task's kept episodes do not depend on the other tasks' counts: a recording that keeps fewer of a
task keeps the first ones a larger recording keeps, from the same seeds, frame for frame (so a
demonstration set of unequal counts is one command, not a filtered copy of a larger one). Bad
counts and task names exit 2 naming the option, the value and what is valid, before anything is
written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fleetrl.cli import main
from fleetrl.config.schema import EnvConfig
from fleetrl.envs.make import simulator_factory
from fleetrl.envs.recorder import RECORDING, Recording, record
from fleetrl.lerobot import layout
from fleetrl.lerobot.reader import TASK, read_frames

TASKS = ["reach-v3", "button-press-topdown-v3"]
ENV = EnvConfig(
    id="fleetrl.envs.metaworld_tasks:MetaWorldTasks",
    kwargs={"tasks": TASKS, "observation": "state", "max_steps": 150},  # the scripted policies need ~50-90 steps
)
CLI_ENV = f"env.kwargs={{tasks: [{', '.join(TASKS)}], observation: state, max_steps: 150}}"


def episodes_by_seed(folder) -> dict[int, dict[str, np.ndarray]]:
    """Every recorded feature of each kept episode (the task text included), by its reset seed."""
    features = json.loads((folder / layout.INFO).read_text())["features"]
    recorded = [name for name in features if name.startswith(("observation.", "action", "next."))]
    frames = read_frames(folder, [*recorded, TASK], "demos")
    starts = frames.episode_starts()
    seeds = json.loads((folder / RECORDING).read_text())["episode_seeds"]
    assert len(seeds) == len(starts) - 1
    return {
        seed: {name: np.asarray(frames.values[name][begin:end]) for name in [*recorded, TASK]}
        for seed, begin, end in zip(seeds, starts[:-1], starts[1:])
    }


def test_fewer_of_a_task_are_the_first_ones_a_larger_recording_keeps(tmp_path):
    equal = record(ENV, 3, tmp_path / "equal", per_task=True)
    unequal = record(ENV, 3, tmp_path / "unequal", per_task=True, task_episodes={"reach-v3": 1})
    assert equal.kept == {"reach-v3": 3, "button-press-topdown-v3": 3}
    assert unequal.kept == {"reach-v3": 1, "button-press-topdown-v3": 3}
    assert unequal.summary(3).startswith("4 successful episodes of ")
    env = simulator_factory(ENV)()
    try:
        task_of = {seed: env.reset(seed=seed)[1]["task"] for seed in equal.seeds}
    finally:
        env.close()
    reach = [seed for seed in equal.seeds if task_of[seed] == "reach-v3"]
    assert unequal.seeds == [seed for seed in equal.seeds if seed not in reach[1:]]
    # the comparison means something only if a reach episode left out was played before one kept
    assert min(reach[1:]) < max(unequal.seeds)
    larger, fewer = episodes_by_seed(tmp_path / "equal"), episodes_by_seed(tmp_path / "unequal")
    assert list(fewer) == unequal.seeds
    for seed, episode in fewer.items():
        assert episode.keys() == larger[seed].keys()
        for name, values in episode.items():
            np.testing.assert_array_equal(values, larger[seed][name], err_msg=f"seed {seed}, {name}")


def test_the_cli_records_the_counts_and_says_what_it_kept(tmp_path, capsys):
    out = tmp_path / "demos"
    argv = ["record", "configs/sft_metaworld.yaml", CLI_ENV, "--episodes", "2", "--per-task"]
    assert main([*argv, "--task-episodes", "button-press-topdown-v3=1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("3 successful episodes of ") and "(button-press-topdown-v3 1, reach-v3 2)" in printed
    assert json.loads((out / layout.INFO).read_text())["total_episodes"] == 3


def test_a_short_count_is_named_with_what_was_kept():
    recording = Recording(wanted={"reach-v3": 3, "push-v3": 1}, kept={"reach-v3": 2, "push-v3": 1}, attempted=9)
    recording.seeds = [0, 4, 7]
    assert recording.summary(3) == (
        "3 successful episodes of 9 attempted (push-v3 1, reach-v3 2); fewer than asked for: reach-v3 2 of 3"
    )


@pytest.mark.parametrize(
    "options, named",
    [
        (["--per-task", "--task-episodes", "reach-v3=0"], ["--task-episodes", "'reach-v3=0'", "integer >= 1"]),
        (["--per-task", "--task-episodes", "reach-v3=two"], ["--task-episodes", "'reach-v3=two'", "TASK=N"]),
        (["--per-task", "--task-episodes", "reach-v3"], ["--task-episodes", "'reach-v3'", "TASK=N"]),
        (["--per-task", "--task-episodes", "reach-v3=1,reach-v3=2"], ["--task-episodes", "each task once"]),
        (
            ["--per-task", "--task-episodes", "reach-v2=3"],
            ["--task-episodes", "'reach-v2'", "did you mean 'reach-v3'", f"its tasks: {', '.join(TASKS)}"],
        ),
        (["--task-episodes", "reach-v3=3"], ["--task-episodes", "add --per-task"]),
    ],
    ids=["zero", "not-a-number", "no-count", "twice", "unknown-task", "without-per-task"],
)
def test_bad_counts_exit_2_naming_the_option_and_what_is_valid(tmp_path, capsys, options, named):
    out = tmp_path / "demos"
    argv = ["record", "configs/sft_metaworld.yaml", CLI_ENV, "--episodes", "2", *options, "--out", str(out)]
    assert main(argv) == 2
    message = capsys.readouterr().err
    assert message.startswith("fleetrl: ") and "Traceback" not in message
    for part in named:
        assert part in message, message
    assert not out.exists()


def test_one_large_count_among_small_ones_is_recorded_whole(tmp_path, capsys):
    """MT10 draws each reset's task among 10, so 5 of reach take about 50 attempts: the attempts
    scale with the largest count and the number of tasks (79 here), not with the 14 episodes in
    all, whose 3 × (42) used to stop the recording with reach short."""
    out = tmp_path / "demos"
    argv = ["record", "configs/sft_metaworld.yaml", "--episodes", "1", "--per-task", "--task-episodes", "reach-v3=5"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("14 successful episodes of 79 attempted") and "reach-v3 5" in printed, printed
    assert "fewer than asked" not in printed
