"""Run the post-training tests: build the agent, play every suite, summarise, write reports."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

import babyai_text
from glam.eval.agents import Agent
from glam.eval.builders import build_agent
from glam.eval.config import DEFAULT_NBR_OBS, RESULT_FILES, PostTrainingTestsConfig
from glam.eval.episodes import SuiteRun, plan_for, prompt_format_of, run_suite, task_families
from glam.eval.generation import GenerationAgent
from glam.eval.mediator_agent import MediatorAgent
from glam.eval.report import suite_record, write_results
from glam.eval.suites import SuitePlan, get_suites
from glam.outputs import EVALUATION, check_output_dir

__all__ = ["RESULT_FILES", "evaluate", "run_tests"]


def resolve_settings(agent: Agent, cfg: PostTrainingTestsConfig) -> tuple[int, str | None]:
    """`(nbr_obs, action_space)`: the config's, else the agent's training ones, else defaults."""
    nbr_obs = cfg.eval.nbr_obs or agent.trained_nbr_obs or DEFAULT_NBR_OBS
    return nbr_obs, cfg.eval.action_space or agent.trained_action_space


def run_tests(
    agent: Agent,
    cfg: PostTrainingTestsConfig,
    on_episode_end: Callable[[str], None] | None = None,
) -> dict[str, SuiteRun]:
    """Play `cfg.eval.episodes` episodes of every suite of `cfg.eval.suites` with `agent`.

    Every suite plays the same seeds: a paired comparison against `no_change` for the suites that
    keep the level (prompt rewrites, renamed actions, French). A suite that is not applicable to
    the agent plays no episode; its run says why.
    """
    nbr_obs, action_space = resolve_settings(agent, cfg)
    runs = {}
    for suite in get_suites(cfg.eval.suites):
        runs[suite.name] = run_suite(
            agent,
            suite,
            level=cfg.eval.level,
            episodes=cfg.eval.episodes,
            num_envs=cfg.eval.num_envs,
            seed_base=cfg.eval.seed_base,
            nbr_obs=nbr_obs,
            action_space=action_space,
            max_steps=cfg.eval.max_steps,
            per_task_type=cfg.eval.episodes_per_task_type,
            distractors=cfg.eval.distractors,
            on_episode_end=(lambda _, name=suite.name: on_episode_end(name))
            if on_episode_end
            else None,
        )
    return runs


def plan_suites(agent: Agent, cfg: PostTrainingTestsConfig) -> dict[str, SuitePlan]:
    """What each suite of `cfg.eval.suites` will play with `agent`, or why it will not."""
    _, action_space = resolve_settings(agent, cfg)
    return {
        suite.name: plan_for(
            agent,
            suite,
            level=cfg.eval.level,
            action_space=action_space,
            seed_base=cfg.eval.seed_base,
        )
        for suite in get_suites(cfg.eval.suites)
    }


def _episodes_of(plan: SuitePlan, cfg: PostTrainingTestsConfig) -> int:
    """Episodes a suite will play (with `episodes_per_task_type`: that times its task types)."""
    per_type = cfg.eval.episodes_per_task_type
    if not plan.applies:
        return 0
    if per_type is None:
        return cfg.eval.episodes
    return per_type * max(1, len(task_families(babyai_text.make(plan.level))))


def _check_levels(cfg: PostTrainingTestsConfig) -> None:
    """Fail before loading any model when a level id is unknown, or cannot take
    `eval.distractors`."""
    levels = {suite.level or cfg.eval.level for suite in get_suites(cfg.eval.suites)}
    known = set(babyai_text.env.known_level_ids())
    unknown = sorted(levels - known)
    if unknown:
        raise ValueError(
            f"unknown level id(s) {unknown}; GLAM levels: {', '.join(babyai_text.LEVELS)}; "
            "or any BabyAI id of minigrid (BabyAI-GoToLocal-v0...)"
        )
    others = sorted(levels - set(babyai_text.LEVELS))
    if cfg.eval.distractors is not None and others:
        raise ValueError(
            f"eval.distractors is for the GLAM levels ({', '.join(babyai_text.LEVELS)}); "
            f"{', '.join(others)} set their own number of objects: leave eval.distractors null"
        )


def evaluate(cfg: PostTrainingTestsConfig) -> tuple[dict[str, Any], dict[str, Path]]:
    """Build the agent, play the suites, write results.*; return the results and their paths.

    Raises:
        glam.outputs.OutputDirError: `eval.output_dir` cannot take the results (a file, not
            writable, holding a training run or another output); an `OutputExistsError` (a
            `FileExistsError`) when it holds earlier results and `eval.overwrite` is false.
        ValueError: an unknown suite or level.
    """
    # Before anything is built or played: results that cannot be written are lost work.
    check_output_dir(
        cfg.eval.output_dir,
        EVALUATION,
        key="eval.output_dir",
        overwrite=cfg.eval.overwrite,
        overwrite_key="eval.overwrite",
    )
    get_suites(cfg.eval.suites)  # unknown suite names fail here, before anything is loaded
    _check_levels(cfg)
    if cfg.eval.torch_threads:
        torch.set_num_threads(cfg.eval.torch_threads)
    start = time.perf_counter()
    agent = build_agent(
        cfg.agent, greedy=cfg.eval.greedy, generation=cfg.eval.generation, client=cfg.eval.client
    )
    try:
        runs = _play(agent, cfg, start)
    finally:
        agent.close()
    return _write(agent, cfg, runs, time.perf_counter() - start)


def _play(agent: Agent, cfg: PostTrainingTestsConfig, start: float) -> dict[str, SuiteRun]:
    """Every suite of `cfg` played by `agent`, with a progress bar (or log lines)."""
    label = cfg.eval.label or agent.name

    total = sum(_episodes_of(plan, cfg) for plan in plan_suites(agent, cfg).values())
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not cfg.eval.progress_bar,
    )
    # A log file (SLURM, nohup) gets no live bar: print a line every tenth of the work instead.
    log_every = max(1, total // 10) if not progress.console.is_terminal else 0
    with progress:
        task = progress.add_task(f"{label}", total=total)

        def advance(suite_name: str) -> None:
            progress.update(task, advance=1, description=f"{label}: {suite_name}")
            done = int(progress.tasks[0].completed)
            if cfg.eval.progress_bar and log_every and done % log_every == 0:
                elapsed = time.perf_counter() - start
                print(f"[eval] {done}/{total} episodes ({suite_name}), {elapsed:.0f} s", flush=True)

        return run_tests(agent, cfg, on_episode_end=advance)


def _protocol(cfg: PostTrainingTestsConfig) -> str:
    """`generation` (BALROG's), `scoring` (a model zero-shot or BC), or the agent's kind."""
    if cfg.agent.protocol == "generation" or cfg.agent.kind in ("zero_shot", "bc"):
        return cfg.agent.protocol
    return cfg.agent.kind


def _write(
    agent: Agent, cfg: PostTrainingTestsConfig, runs: dict[str, SuiteRun], elapsed: float
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Summarise the runs into results.json, .csv, .md, .png and episodes.jsonl."""
    nbr_obs, action_space = resolve_settings(agent, cfg)
    results = {
        "label": cfg.eval.label or agent.name,
        "nbr_obs": nbr_obs,
        "action_space": action_space or "level default",
        "prompt_format": prompt_format_of(agent),
        "protocol": _protocol(cfg),
        "seed_base": cfg.eval.seed_base,
        "agent": asdict(cfg.agent),
        "eval": asdict(cfg.eval),
        "elapsed_seconds": round(elapsed, 1),
        "suites": {name: suite_record(run, agent.suite_figures) for name, run in runs.items()},
    }
    if isinstance(agent, GenerationAgent):
        results["generation"] = agent.usage()
    if isinstance(agent, MediatorAgent):  # the settings it played (a checkpoint: its run's)
        results["ask"] = asdict(agent.cfg)
    output_dir = Path(cfg.eval.output_dir)
    paths = write_results(output_dir, results)
    paths["episodes"] = output_dir / "episodes.jsonl"
    with paths["episodes"].open("w") as handle:
        for name, run in runs.items():
            for episode in run.episodes:
                record = asdict(episode)
                record |= record.pop("figures")  # an agent's own, beside the others (most: none)
                handle.write(json.dumps({"suite": name, **record}) + "\n")
    return results, paths
