"""Coded actions (glam.codeact): the sandbox's refusals and limits, the view, the env's frame
accounting and statistics, and the library's skills on real BabyAI levels.

.venv/bin/python -m pytest tests/test_codeact_sandbox.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gymnasium.error import ResetNeeded

import babyai_text
from glam.codeact.api import AGENT_COL, AGENT_ROW, DIRECTIONS, build_view
from glam.codeact.env import CodedActionsEnv
from glam.codeact.library import go_to, open_door, pick_up, skill_source
from glam.codeact.sandbox import Sandbox, SandboxConfig, validate

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")


def action(body: str) -> str:
    """A coded action whose `step` has `body` (lines separated by newlines)."""
    lines = "\n".join("    " + line for line in body.splitlines())
    return f"def step(view, memory):\n{lines}\n"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has stopped running all the same.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(WORDS) as shared:
        yield shared


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import os\n" + action("return 'done'"), "import is not allowed"),
        (action("from os import path\nreturn 'done'"), "import is not allowed"),
        (action("return ().__class__"), '"__class__" is an invalid attribute name'),
        (action("return ().__class__.__bases__[0].__subclasses__()"), "invalid attribute name"),
        (action("return (x for x in ()).gi_frame.f_back"), '"f_back" is a restricted name'),
        (action("x = view._mapping\nreturn 'done'"), '"_mapping" is an invalid attribute name'),
        (action("return open('/etc/passwd').read()"), "open is not allowed"),
        (action("return eval('1')"), "Eval calls are not allowed"),
        (action("exec('x = 1')\nreturn 'done'"), "Exec calls are not allowed"),
        (action("return globals()"), "globals is not allowed"),
        (action("return getattr(view, 'x')"), "getattr is not allowed"),
        ("class A:\n    pass\n" + action("return 'done'"), "class definitions are not allowed"),
        ("x = 1\n", "no function step(view, memory)"),
        ("def step(view):\n    return 'done'\n", "step must take exactly two arguments"),
        (action("return 'done'"[:-3]), "SyntaxError"),
    ],
)
def test_validate_refuses_with_a_clear_one_line_message(source: str, message: str) -> None:
    error = validate(source)
    assert error is not None and message in error and "\n" not in error


def test_refused_code_comes_back_as_a_compile_error_never_an_exception(sandbox) -> None:
    result = sandbox.call("import os\n" + action("return 'done'"), {}, {})
    assert (result.ok, result.error_kind, result.error) == (
        False,
        "compile",
        "Line 1: import is not allowed",
    )
    assert validate(action("memory['n'] = len(view['grid'])\nreturn 'turn left'")) is None


def test_a_call_returns_a_word_and_the_memory(sandbox) -> None:
    source = action("memory['seen'] = memory.get('seen', 0) + 1\nx = 0\nx += 2\nreturn WORDS[x]")
    source = "WORDS = ('turn left', 'turn right', 'go forward')\n" + source
    result = sandbox.call(source, {}, {"seen": 4})
    assert (result.ok, result.action, result.memory) == (True, "go forward", {"seen": 5})
    assert result.lines == 6  # the module body's two (the tuple, the def), step's four


def test_an_infinite_loop_ends_by_the_line_budget_fast(sandbox) -> None:
    for body in ("while True:\n    pass", "while True:\n    try:\n        pass\n"
                 "    except BaseException:\n        pass"):  # fmt: skip
        result = sandbox.call(action(body), {}, {})
        assert (result.error_kind, result.error) == ("budget", "line budget of 10000 exceeded")
        assert result.seconds < sandbox.cfg.timeout_s


@pytest.mark.parametrize(
    "body",
    [
        "while True:\n    pass",  # no line budget: only the clock stops it
        "return 7 ** (10 ** 7)",  # seconds of C with no line to count
    ],
)
def test_an_overrunning_call_times_out_and_the_worker_restarts(body: str) -> None:
    cfg = SandboxConfig(line_budget=None, timeout_s=0.5)
    with Sandbox(WORDS, cfg) as sandbox:
        first = sandbox.pid
        result = sandbox.call(action(body), {}, {"kept": 1})
        assert (result.ok, result.error_kind, result.error) == (
            False,
            "timeout",
            "took longer than 0.5 s",
        )
        assert result.memory == {"kept": 1}
        assert not alive(first)
        again = sandbox.call(action("return 'drop'"), {}, {})
        assert (again.ok, again.action, sandbox.restarts) == (True, "drop", 1)
        assert sandbox.pid != first


def test_a_huge_allocation_fails_by_the_memory_limit_and_the_worker_goes_on(sandbox) -> None:
    result = sandbox.call(action("return [0] * (10 ** 10)"), {}, {})
    assert (result.error_kind, result.error) == (
        "runtime",
        "MemoryError: over the memory limit of 512 MB",
    )
    assert sandbox.call(action("return 'drop'"), {}, {}).action == "drop"


def test_a_result_too_large_to_send_back_is_a_runtime_error_not_a_dead_worker(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """300 MB kept in the memory (or returned) fit the 512 MB limit but not their copy on the way
    back: the worker died ("sandbox process died") with a traceback on the learner's terminal.
    The same at a smaller scale: 40 MB under a 64 MB limit."""
    with Sandbox(WORDS, SandboxConfig(memory_mb=64, timeout_s=30.0)) as sandbox:
        for body in ("memory['x'] = 'a' * 40_000_000", "return 'a' * 40_000_000"):
            result = sandbox.call(action(f"{body}\nreturn 'drop'"), {}, {})
            assert (result.error_kind, result.memory) == ("runtime", {}), result
            assert "memory limit of 64 MB" in result.error
        assert sandbox.restarts == 0  # the worker went on: never restarted
        assert sandbox.call(action("return 'drop'"), {}, {}).action == "drop"
    assert "Traceback" not in capfd.readouterr().err


def test_runtime_errors_and_invalid_actions_are_reported(sandbox) -> None:
    cases = {
        "x = 1\nreturn x / 0": ("runtime", "ZeroDivisionError: division by zero (line 3)"),
        "return view['nothing']": ("runtime", "KeyError: 'nothing' (line 2)"),
        "view['x'] = 1": ("runtime", "TypeError: object does not support item or slice"),
        "memory['f'] = step\nreturn 'done'": ("runtime", "memory must hold plain data only"),
        "return 'jump'": ("invalid_action", "step returned 'jump', which is not one of"),
        "return 3": ("invalid_action", "step returned 3 (int), not an action word"),
    }
    for body, (kind, message) in cases.items():
        result = sandbox.call(action(body), {}, {})
        assert not result.ok and result.action is None
        assert result.error_kind == kind and result.error.startswith(message), result


def test_close_leaves_no_process() -> None:
    sandbox = Sandbox(WORDS)
    pid = sandbox.pid
    assert alive(pid)
    sandbox.close()
    assert not alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        sandbox.call(action("return 'drop'"), {}, {})


def test_the_worker_exits_when_its_parent_dies(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from glam.codeact.sandbox import Sandbox\n"
        "if __name__ == '__main__':\n"
        "    sandbox = Sandbox(['turn left'])\n"
        "    print(sandbox.pid, flush=True)\n"
        "    os._exit(0)\n"  # no close, no atexit: as if killed
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = tmp_path / "orphan.py"
    script.write_text(code)
    output = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True
    )
    pid = int(output.stdout.split()[0])
    deadline = time.monotonic() + 10.0
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid)


# ---- the view ----


def test_the_view_is_the_agents_egocentric_grid() -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    obs, info = env.reset(seed=3)
    view = build_view(env, obs, info, env.action_words, 0)
    base = env.unwrapped
    assert len(view["grid"]) == 7 and all(len(row) == 7 for row in view["grid"])
    assert view["grid"][AGENT_ROW][AGENT_COL] == ("empty", "", "")  # hands empty
    assert view["front"] == view["grid"][AGENT_ROW - 1][AGENT_COL]
    ahead = base.grid.get(*base.front_pos)
    assert view["front"][0] == ("empty" if ahead is None else ahead.type)
    assert view["direction"] == DIRECTIONS[base.agent_dir]
    assert view["position"] == tuple(int(v) for v in base.agent_pos)
    assert view["descriptions"] == tuple(info["descriptions"])
    assert (view["mission"], view["carrying"], view["actions"]) == (
        obs["mission"],
        None,
        env.action_words,
    )
    # Every object the descriptions name is in the grid with its color.
    for sentence in info["descriptions"]:
        named = re.search(r"You see an? (\w+) (ball|box|key)", sentence)
        if named:
            cells = {cell[:2] for row in view["grid"] for cell in row}
            assert (named[2], named[1]) in cells


# ---- the env ----


def recorded(env: babyai_text.TextEnv) -> list[float]:
    """Make `env.step` log each primitive step's reward."""
    rewards: list[float] = []
    step = env.step

    def logged(word):
        result = step(word)
        rewards.append(float(result[1]))
        return result

    env.step = logged
    return rewards


def test_a_coded_action_takes_primitive_steps_and_sums_their_rewards(sandbox) -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    rewards = recorded(env)
    obs, _ = env.reset(seed=0)
    name = obs["mission"]
    coded = CodedActionsEnv(env, {name: go_to(*name.split()[-2:])}, sandbox)
    assert coded.action_words == (*env.action_words, name)
    coded.reset(seed=0)
    _, reward, terminated, truncated, info = coded.step("turn left")
    assert (info["primitive_steps"], info["codeact"]["outcome"], len(rewards)) == (
        1,
        "primitive",
        1,
    )
    _, reward, terminated, truncated, info = coded.step(len(env.action_words))  # by index
    assert terminated and info["success"] and info["codeact"]["outcome"] == "episode_end"
    assert info["primitive_steps"] == len(rewards) - 1 == env.unwrapped.step_count - 1
    assert reward == pytest.approx(sum(rewards[1:])) and reward > 0
    with pytest.raises(ResetNeeded):
        coded.step("turn left")


def test_memory_lasts_one_execution_and_steps_are_capped(sandbox) -> None:
    three_turns = action(
        "memory['n'] = memory.get('n', 0) + 1\nreturn 'turn left' if memory['n'] <= 3 else 'done'"
    )
    spin = action("return 'turn right'")
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    coded = CodedActionsEnv(
        env, {"three turns": three_turns, "spin": spin}, sandbox, max_steps_per_action=5
    )
    coded.reset(seed=1)
    for _ in range(2):  # the same three steps each time: the memory starts empty
        _, _, _, _, info = coded.step("three turns")
        assert (info["primitive_steps"], info["codeact"]["outcome"]) == (3, "done")
    _, _, _, _, info = coded.step("spin")
    assert (info["primitive_steps"], info["codeact"]["outcome"]) == (5, "step_limit")
    assert env.unwrapped.step_count == 11


def test_an_empty_coded_action_costs_one_noop_frame_and_cannot_loop_for_ever(sandbox) -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0", max_steps=4)
    coded = CodedActionsEnv(
        env, {"nothing": action("return 'done'"), "broken": action("return 1 / 0")}, sandbox
    )
    obs, _ = coded.reset(seed=2)
    frames = 0
    for name in ("nothing", "broken", "nothing", "broken"):
        after, reward, terminated, truncated, info = coded.step(name)
        frames += info["primitive_steps"]
        assert (info["primitive_steps"], reward, terminated) == (1, 0.0, False)
        assert (after["image"] == obs["image"]).all() and info["events"] == []
    assert truncated and frames == env.unwrapped.step_count == 4
    assert info["codeact"] == {
        "action": "broken",
        "outcome": "failed",
        "error_kind": "runtime",
        "error": "ZeroDivisionError: division by zero (line 2)",
    }


def test_statistics_per_coded_action(sandbox) -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    sources = {
        "turn": action("return 'turn left' if view['steps'] < 2 else 'done'"),
        "broken": action("return memory['missing']"),
        "bad word": action("return 'fly'"),
        "unused": action("return 'done'"),
    }
    coded = CodedActionsEnv(env, sources, sandbox)
    coded.reset(seed=0)
    for name in ("turn", "turn", "broken", "bad word", "broken"):
        coded.step(name)
    stats = coded.pop_stats()
    assert (stats["turn"].uses, stats["turn"].finished, stats["turn"].primitive_steps) == (2, 2, 4)
    assert (stats["broken"].uses, dict(stats["broken"].failures)) == (2, {"runtime": 2})
    assert stats["broken"].errors == ["KeyError: 'missing' (line 2)"]
    assert dict(stats["bad word"].failures) == {"invalid_action": 1}
    assert stats["unused"].uses == 0
    assert all(entry.uses == 0 for entry in coded.pop_stats().values())


def test_the_env_checks_its_coded_actions_names_and_sandbox(sandbox) -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    with pytest.raises(ValueError, match="clash"):
        CodedActionsEnv(env, {"go forward": action("return 'done'")}, sandbox)
    with (
        Sandbox(("turn left",)) as other,
        pytest.raises(ValueError, match="not the env's"),
    ):
        CodedActionsEnv(env, {}, other)


# ---- the library on real levels ----


def success_rate(level: str, seeds: range, plan) -> float:
    """Run the coded actions `plan(mission)` names, in order, from each seeded episode."""
    env = babyai_text.make(level)
    successes = 0
    with Sandbox(env.action_words) as sandbox:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            names = plan(obs["mission"])
            coded = CodedActionsEnv(
                env, {name: skill_source(name) for name in names}, sandbox, max_steps_per_action=64
            )
            coded.reset(seed=seed)
            for name in names:
                _, reward, terminated, truncated, info = coded.step(name)
                if terminated or truncated:
                    break
            successes += int(info["success"])
    return successes / len(seeds)


def without_location(mission: str) -> str:
    return re.sub(r" (on your (left|right)|in front of you|behind you)$", "", mission)


@pytest.mark.slow
def test_library_skills_solve_real_levels() -> None:
    """Thresholds a little under what was measured (50 seeds: GoToLocal 49, PickupLoc 44;
    UnlockLocal 29 of 30 by "pick up the key" then "open the door"); PickupLoc's locations
    ("the red ball on your left") are ignored, the closest such object taken."""
    assert success_rate("BabyAI-GoToLocal-v0", range(50), lambda mission: [mission]) >= 0.9
    pick = success_rate(
        "BabyAI-PickupLoc-v0",
        range(50),
        lambda mission: [without_location(mission).replace("pick up a ", "pick up the ")],
    )
    assert pick >= 0.8
    unlock = success_rate(  # "open the door": the room's one locked door, its key in the room
        "BabyAI-UnlockLocal-v0", range(30), lambda mission: ["pick up the key", mission]
    )
    assert unlock >= 0.8


def test_explore_walks_off_in_a_maze_of_rooms(sandbox) -> None:
    """Measured: 16 steps and "done" in 20 seeds of 20, the agent elsewhere in 19."""
    env = babyai_text.make("BabyAI-GoToObjMaze-v0")
    coded = CodedActionsEnv(env, {"explore": skill_source("explore")}, sandbox)
    moved = 0
    for seed in range(10):
        coded.reset(seed=seed)
        start = tuple(env.unwrapped.agent_pos)
        _, _, _, _, info = coded.step("explore")
        assert (info["codeact"]["outcome"], info["primitive_steps"]) == ("done", 16)
        moved += tuple(env.unwrapped.agent_pos) != start
    assert moved >= 8


def test_skill_names_parse_to_their_templates() -> None:
    assert skill_source("go to the red ball") == go_to("red", "ball")
    assert skill_source("pick up a key") == pick_up(None, "key")
    assert skill_source("open the blue door") == open_door("blue")
    assert validate(skill_source("explore")) is None
    with pytest.raises(ValueError, match="no skill is named"):
        skill_source("fly to the moon")
