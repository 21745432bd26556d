"""Run the post-training tests: build the agent, play every suite, summarise, write reports."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

import babyai_text
from glam.eval.agents import Agent
from glam.eval.builders import build_agent, trained_level
from glam.eval.config import DEFAULT_LEVEL, DEFAULT_NBR_OBS, RESULT_FILES, PostTrainingTestsConfig
from glam.eval.episodes import SuiteRun, plan_for, prompt_format_of, run_suite, task_families
from glam.eval.generation import GenerationAgent
from glam.eval.journal import JOURNAL, Journal, SuiteProgress, journal_settings
from glam.eval.mediator_agent import MediatorAgent
from glam.eval.report import suite_record, write_results
from glam.eval.stats import EpisodeResult
from glam.eval.suites import SuitePlan, get_suites
from glam.outputs import EPISODES_JSONL, EVALUATION, OutputExistsError, check_output_dir
from glam.threads import set_torch_threads

__all__ = ["HEARTBEAT_S", "RESULT_FILES", "evaluate", "run_tests"]

HEARTBEAT_S = 300.0
"""Without a terminal, the longest time without a progress line while envs play."""


def resolve_settings(agent: Agent, cfg: PostTrainingTestsConfig) -> tuple[int, str | None]:
    """`(nbr_obs, action_space)`: the config's, else the agent's training ones, else defaults."""
    nbr_obs = cfg.eval.nbr_obs or agent.trained_nbr_obs or DEFAULT_NBR_OBS
    return nbr_obs, cfg.eval.action_space or agent.trained_action_space


def run_tests(
    agent: Agent,
    cfg: PostTrainingTestsConfig,
    on_episode_end: Callable[[str, EpisodeResult, SuiteRun], None] | None = None,
    earlier: dict[str, SuiteProgress] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, SuiteRun]:
    """Play `cfg.eval.episodes` episodes of every suite of `cfg.eval.suites` with `agent`.

    Every suite plays the same seeds: a paired comparison against `no_change` for the suites that
    keep the level (prompt rewrites, renamed actions, French). A suite that is not applicable to
    the agent plays no episode; its run says why. `earlier`: what an interrupted evaluation
    finished, by suite (`glam.eval.journal`), kept and not played again; `on_episode_end` is
    called with the suite's name, the episode and the suite's run so far, `on_step` after each
    step of the envs with their number.
    """
    earlier = earlier or {}
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
            earlier=earlier.get(suite.name),
            on_episode_end=(
                lambda episode, run, name=suite.name: on_episode_end(name, episode, run)
            )
            if on_episode_end
            else None,
            on_step=on_step,
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


def resolve_level(cfg: PostTrainingTestsConfig) -> str:
    """Set a null `eval.level` to the level a checkpoint was trained on (its record), else to
    `DEFAULT_LEVEL`, saying which; return it. A given level is kept."""
    if cfg.eval.level is None:
        trained = trained_level(cfg.agent)
        cfg.eval.level = trained or DEFAULT_LEVEL
        if cfg.agent.kind == "checkpoint":  # the other agents always play the default
            why = "its training level" if trained else "the default: it records no level"
            print(f"[eval] eval.level=null: the checkpoint plays {cfg.eval.level} ({why})")
    return cfg.eval.level


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

    Every finished episode goes to the journal (`glam.eval.journal`) as it ends; an evaluation
    that stops before its end continues with `eval.resume=true`.

    Raises:
        glam.outputs.OutputDirError: `eval.output_dir` cannot take the results (a file, not
            writable, holding a training run or another output); an `OutputExistsError` (a
            `FileExistsError`) when it holds earlier results, or an unfinished evaluation, and
            neither `eval.overwrite` nor (for the latter) `eval.resume` is on.
        glam.eval.journal.JournalError: `eval.resume` without a journal, or with one that is
            damaged or was written with other settings.
        ValueError: an unknown suite or level.
    """
    # Before anything is built or played: results that cannot be written are lost work.
    unfinished = Journal.found(cfg.eval.output_dir)
    if unfinished is not None and not (cfg.eval.resume or cfg.eval.overwrite):
        raise OutputExistsError(
            f"eval.output_dir={cfg.eval.output_dir!r} holds an unfinished evaluation ({unfinished} "
            f"episodes finished, in {JOURNAL}): pass eval.resume=true to play the rest with the "
            "same settings, eval.overwrite=true to start again, or choose another eval.output_dir"
        )
    check_output_dir(
        cfg.eval.output_dir,
        EVALUATION,
        key="eval.output_dir",
        overwrite=cfg.eval.overwrite or cfg.eval.resume,
        overwrite_key="eval.overwrite",
    )
    get_suites(cfg.eval.suites)  # unknown suite names fail here, before anything is loaded
    resolve_level(cfg)
    _check_levels(cfg)
    journal = Journal.open(
        cfg.eval.output_dir, journal_settings(cfg.agent, cfg.eval), resume=cfg.eval.resume
    )
    if journal.resumes:
        print(
            f"[eval] resuming {cfg.eval.output_dir}: {journal.episodes_done} episodes finished "
            f"by {journal.resumes} earlier run(s), {journal.earlier_elapsed:.0f} s",
            flush=True,
        )
    threads = set_torch_threads(cfg.eval.torch_threads, "eval.torch_threads")
    print(f"[eval] {threads.describe()}", flush=True)
    agent = build_agent(
        cfg.agent, greedy=cfg.eval.greedy, generation=cfg.eval.generation, client=cfg.eval.client
    )
    try:
        runs = _play(agent, cfg, journal)
    finally:
        agent.close()
        journal.close(remove=False)
    results, paths = _write(agent, cfg, runs, journal)
    journal.close(remove=True)
    return results, paths


def _play(agent: Agent, cfg: PostTrainingTestsConfig, journal: Journal) -> dict[str, SuiteRun]:
    """Every suite of `cfg` played by `agent`, with a progress bar (or log lines), each
    finished episode in `journal`."""
    label = cfg.eval.label or agent.name
    usage = agent.usage if isinstance(agent, GenerationAgent) else lambda: None

    total = sum(_episodes_of(plan, cfg) for plan in plan_suites(agent, cfg).values())
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not cfg.eval.progress_bar,
    )
    # A log file (SLURM, nohup) gets no live bar: print a line every tenth of the work instead,
    # and at least every HEARTBEAT_S while envs play (a BALROG episode can take an hour).
    log_every = max(1, total // 10) if not progress.console.is_terminal else 0
    log = cfg.eval.progress_bar and log_every > 0
    steps, last_line = 0, journal.elapsed()
    with progress:
        task = progress.add_task(f"{label}", total=total, completed=journal.episodes_done)

        def advance(suite_name: str, episode: EpisodeResult, run: SuiteRun) -> None:
            nonlocal last_line
            journal.record(suite_name, episode, run, usage())
            progress.update(task, advance=1, description=f"{label}: {suite_name}")
            done = int(progress.tasks[0].completed)
            if log and done % log_every == 0:
                last_line = journal.elapsed()
                print(
                    f"[eval] {done}/{total} episodes ({suite_name}), {last_line:.0f} s", flush=True
                )

        def heartbeat(envs: int) -> None:
            nonlocal steps, last_line
            steps += 1
            now = journal.elapsed()
            if log and now - last_line >= HEARTBEAT_S:
                last_line = now
                done = int(progress.tasks[0].completed)
                print(
                    f"[eval] {done}/{total} episodes, {steps} steps played by this run "
                    f"({envs} envs in the last), {last_line:.0f} s",
                    flush=True,
                )

        return run_tests(
            agent, cfg, on_episode_end=advance, earlier=journal.earlier, on_step=heartbeat
        )


def _protocol(cfg: PostTrainingTestsConfig) -> str:
    """`generation` (BALROG's), `scoring` (a model zero-shot or BC), or the agent's kind."""
    if cfg.agent.protocol == "generation" or cfg.agent.kind in ("zero_shot", "bc"):
        return cfg.agent.protocol
    return cfg.agent.kind


def _write(
    agent: Agent, cfg: PostTrainingTestsConfig, runs: dict[str, SuiteRun], journal: Journal
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
        "elapsed_seconds": round(journal.elapsed(), 1),
        "suites": {name: suite_record(run, agent.suite_figures) for name, run in runs.items()},
    }
    if journal.resumes:  # the seconds and usage are those of every run together
        results["resumed"] = {"runs": journal.resumes + 1, "episodes_kept": journal.episodes_done}
    if isinstance(agent, GenerationAgent):
        results["generation"] = journal.usage(agent.usage())
    if isinstance(agent, MediatorAgent):  # the settings it played (a checkpoint: its run's)
        results["ask"] = asdict(agent.cfg)
    output_dir = Path(cfg.eval.output_dir)
    paths = write_results(output_dir, results)
    paths["episodes"] = output_dir / EPISODES_JSONL
    with paths["episodes"].open("w") as handle:
        for name, run in runs.items():
            for episode in run.episodes:
                record = asdict(episode)
                record |= record.pop("figures")  # an agent's own, beside the others (most: none)
                handle.write(json.dumps({"suite": name, **record}) + "\n")
    return results, paths
