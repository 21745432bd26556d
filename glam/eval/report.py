"""Write evaluation results (JSON, CSV, markdown, bar chart) and aggregate several of them.

One evaluation writes `results.json`: its config, and per suite what it played (`level`,
`action_space` and its `action_words`, `prompt_format`, `language`) and the summary of its
episodes (`success_rate`, 95% Wilson `ci_low`/`ci_high`, `mean_return`, `mean_length`,
`episodes`...), overall and per task type. A suite that could not apply to the agent has
`status` "not applicable" and a `reason` instead of figures; it is listed in the tables with
its reason and left out of the charts, and `aggregate` leaves it out of the means.

`aggregate` reads many results (runs x seeds) into the paper's table: per suite the mean success
over seeds, its spread, and the change against the `no_change` suite.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glam.eval.stats import EpisodeResult, balrog_progress, summarize
from glam.eval.suites import TASK_FAMILIES
from glam.outputs import SUMMARY

if TYPE_CHECKING:  # the episode loop imports every agent (torch, transformers): only its type here
    from glam.eval.episodes import SuiteRun

__all__ = [
    "AggregateRow",
    "NOT_APPLICABLE",
    "aggregate",
    "check_baseline",
    "excluded_suites",
    "not_applicable",
    "find_results",
    "read_results",
    "suite_record",
    "write_aggregate",
    "write_results",
    "SUMMARY_FILES",
]

RESULTS_FILE = "results.json"
SUMMARY_FILES = SUMMARY.files
"""What `write_aggregate` writes (`glam.outputs.SUMMARY`)."""
_SUMMARY_FIELDS = ("success_rate", "ci_low", "ci_high", "mean_return", "mean_length", "episodes")
_SETUP_FIELDS = ("level", "action_space", "prompt_format", "language")
"""What a suite played, in every table."""
RAN, NOT_APPLICABLE = "ran", "not applicable"
"""`status` of a suite record."""


FiguresFn = Callable[[Sequence[EpisodeResult]], dict[str, float]]
"""Episodes -> the agent's own figures of them (`glam.eval.agents.Agent.suite_figures`)."""
AGENT_FIGURES = "agent_figures"
"""Key of a suite record (and of each of its task types) holding the agent's own figures
(a mediator's queries, `ask/*`); absent for agents without any."""


def suite_record(run: SuiteRun, figures: FiguresFn | None = None) -> dict[str, Any]:
    """The JSON record of one suite: what it played, overall figures, then per task type.

    A suite not applicable to the agent gets its `reason` and no figures. `figures` adds the
    agent's own (`AGENT_FIGURES`), overall and per task type, when it gives any.
    """
    plan = run.plan
    setup = {
        "status": RAN if plan.applies else NOT_APPLICABLE,
        "description": plan.suite.description,
        "level": plan.level,
        "action_space": plan.action_space.name,
        "action_words": list(plan.action_space.words),
        "prompt_format": plan.prompt_format,
        "language": plan.language,
    }
    if not plan.applies:
        return {**setup, "reason": plan.not_applicable}
    by_task: dict[str, list] = defaultdict(list)
    for result in run.episodes:
        task = result.task_type or "unknown"
        by_task[TASK_FAMILIES.get(task, task)].append(result)

    def summary(results: Sequence[EpisodeResult]) -> dict[str, Any]:
        own = figures(results) if figures is not None else {}
        return {**summarize(results).to_dict(), **({AGENT_FIGURES: own} if own else {})}

    overall = summary(run.episodes)
    own = overall.pop(AGENT_FIGURES, None)
    return {
        **setup,
        **overall,
        "rewritten_prompt_fraction": run.prompts_rewritten / max(run.prompts_seen, 1),
        "example_prompt": run.example_prompt,
        **({AGENT_FIGURES: own} if own else {}),
        "per_task_type": {task: summary(results) for task, results in sorted(by_task.items())},
        "balrog": _balrog_form(run.episodes, by_task),
    }


BALROG_TASK_NAMES = {"pickup_then_goto": "pick_up_seq_go_to"}
"""BALROG's names of MixedTrainLocal's task types, where they differ from ours."""


def _balrog_form(
    episodes: Sequence[EpisodeResult], by_task: Mapping[str, Sequence[EpisodeResult]]
) -> dict[str, Any]:
    """The suite's figures as BALROG reports them: progression in % with its standard error,
    overall and per task (under BALROG's task names)."""

    def form(results: Sequence[EpisodeResult]) -> dict[str, Any]:
        progress, error = balrog_progress([float(r.success) for r in results])
        return {
            "progression_percentage": progress,
            "standard_error": error,
            "episodes_played": len(results),
        }

    return {
        **form(episodes),
        "tasks": {
            BALROG_TASK_NAMES.get(task, task): form(results)
            for task, results in sorted(by_task.items())
        },
    }


def _ran(record: Mapping[str, Any]) -> bool:
    """Whether a suite record holds figures (records written before `status` existed do)."""
    return record.get("status", RAN) != NOT_APPLICABLE


def not_applicable(results: Mapping[str, Any]) -> dict[str, str]:
    """The suites of one results.json that were not applicable, with their reasons."""
    return {
        name: record.get("reason", "")
        for name, record in results["suites"].items()
        if not _ran(record)
    }


def _fmt_rate(record: Mapping[str, Any]) -> str:
    return f"{record['success_rate']:.3f} [{record['ci_low']:.3f}, {record['ci_high']:.3f}]"


def _actions_text(results: Mapping[str, Any]) -> str:
    protocol = results["protocol"]
    ask = results.get("ask")
    if ask is not None:  # LLM4RL's mediator (`glam.eval.mediator_agent`)
        who = {
            "learned": "the mediator's "
            + ("greedy choices" if results["eval"]["greedy"] else "sampled choices"),
            "always": "asking at every step",
            "skill_end": "asking only when a skill ends (forced queries)",
            "random": f"asking with probability {ask['probability']:g} at each step",
        }[ask["mode"]]
        budget = f", at most {ask['budget']} by choice per episode" if ask["budget"] else ""
        return (
            f"subgoals of the {ask['planner']} planner carried out by skills, {who}{budget} "
            f"(ask.mode={ask['mode']}; a query costs {ask['cost']:g} + {ask['repeat_cost']:g} "
            "f_rep, subtracted from the return)"
        )
    if protocol == "generation":
        generation, client = results["eval"]["generation"], results["eval"]["client"]
        temperature = client["temperature"]
        sampling = "greedy" if temperature == 0 else f"temperature {temperature}"
        feedback = "on" if generation["feedback_on_invalid_action"] else "off"
        return (
            f"actions written by the model in BALROG's dialogue (agent {generation['agent_type']}, "
            f"{generation['max_history']} turns, {sampling}, at most {client['max_tokens']} "
            f"tokens, invalid answers -> go forward, feedback {feedback})"
        )
    if protocol in ("random", "bot"):
        return {"random": "uniformly random actions", "bot": "BabyAI's bot"}[protocol]
    return (
        "greedy actions (policy argmax)"
        if results["eval"]["greedy"]
        else "actions sampled from the policy"
    )


def _seeds_text(results: Mapping[str, Any]) -> str:
    per_type = results.get("eval", {}).get("episodes_per_task_type")
    if per_type:
        return f"The first {per_type} seeds from {results['seed_base']} up that draw each task type"
    return f"Seeds {results['seed_base']} + (0 .. episodes-1)"


def _results_markdown(results: Mapping[str, Any]) -> str:
    lines = [
        f"# Evaluation: {results['label']}",
        "",
        f"{_seeds_text(results)}; {_actions_text(results)}; success with its 95% Wilson interval.",
        "",
        "| suite | level | action space | prompt | language | success [95% CI] | mean return "
        "| mean length | episodes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ran = {name: record for name, record in results["suites"].items() if _ran(record)}
    for name, record in results["suites"].items():
        setup = " | ".join(str(record.get(key, "")) for key in _SETUP_FIELDS)
        if name not in ran:
            lines.append(f"| {name} | {setup} | not applicable | – | – | 0 |")
            continue
        lines.append(
            f"| {name} | {setup} | {_fmt_rate(record)} | {record['mean_return']:.3f} "
            f"| {record['mean_length']:.1f} | {record['episodes']} |"
        )
    skipped = not_applicable(results)
    if skipped:
        lines += [
            "",
            "Not applicable to this agent (no episode played, left out of the chart):",
            "",
        ]
        lines += [f"- {name}: {reason}" for name, reason in skipped.items()]
    if results["protocol"] == "generation":
        lines.append("")
        for name, record in ran.items():
            lines.append(
                f"{name}: {100 * record['invalid_action_rate']:.1f}% of the answers were not an "
                "action (replaced by go forward)."
            )
    else:  # a policy that writes its action, played as in its training
        invalid = {
            n: r["invalid_action_rate"] for n, r in ran.items() if r.get("invalid_action_rate")
        }
        if invalid:
            lines.append("")
        for name, rate in invalid.items():
            lines.append(
                f"{name}: {100 * rate:.1f}% of the written answers named no action (played as in "
                "the policy's training: `generate.invalid_action`)."
            )
    lines += _figures_markdown(ran)
    lines += ["", "## Per task type", ""]
    lines += ["| suite | task type | success [95% CI] | mean length | episodes |"]
    lines.append("|---|---|---|---|---|")
    for name, record in ran.items():
        for task, task_record in record["per_task_type"].items():
            lines.append(
                f"| {name} | {task} | {_fmt_rate(task_record)} "
                f"| {task_record['mean_length']:.1f} | {task_record['episodes']} |"
            )
    if results["protocol"] == "generation":
        lines += _balrog_markdown(ran)
    return "\n".join(lines) + "\n"


def _figures_markdown(ran: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The agent's own figures (`AGENT_FIGURES`), one row per suite; nothing without any."""
    records = {
        name: record[AGENT_FIGURES] for name, record in ran.items() if AGENT_FIGURES in record
    }
    if not records:
        return []
    keys = list(dict.fromkeys(key for own in records.values() for key in own))
    lines = [
        "",
        "## The agent's own figures",
        "",
        "| suite | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for name, own in records.items():
        cells = [f"{own[key]:.4g}" if key in own else "–" for key in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _balrog_markdown(ran: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """BALROG's form of the figures: progression (%) ± standard error, per task and overall."""
    lines = [
        "",
        "## BALROG's form",
        "",
        "Progression in % ± standard error (BALROG's: the standard deviation over the episodes "
        "over sqrt(n)), beside our success rate and 95% Wilson interval.",
        "",
        "| suite | task (BALROG's name) | progression ± s.e. (%) | success [95% CI] | episodes |",
        "|---|---|---|---|---|",
    ]
    for name, record in ran.items():
        form = record.get("balrog")
        if not form:
            continue
        ours = dict(zip(form["tasks"], record["per_task_type"].values(), strict=True))
        for task, task_form in [*form["tasks"].items(), ("all", form)]:
            mine = record if task == "all" else ours[task]
            lines.append(
                f"| {name} | {task} | {task_form['progression_percentage']:.1f} ± "
                f"{task_form['standard_error']:.1f} | {_fmt_rate(mine)} "
                f"| {task_form['episodes_played']} |"
            )
    return lines


def _results_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per suite and task type; a suite not applicable: one row, its reason, no figures."""
    figures = (*_SUMMARY_FIELDS, "invalid_action_rate")
    # The agent's own figures (a mediator's queries) get columns after these, when it has any.
    own = list(
        dict.fromkeys(
            key
            for record in results["suites"].values()
            for summary in (record, *record.get("per_task_type", {}).values())
            for key in summary.get(AGENT_FIGURES, {})
        )
    )
    rows = []
    for name, record in results["suites"].items():
        head = {"label": results["label"], "suite": name}
        head |= {key: record.get(key, "") for key in _SETUP_FIELDS}
        tail = {"status": record.get("status", RAN), "reason": record.get("reason", "")}
        if not _ran(record):
            blank = dict.fromkeys((*figures, *own), "")
            rows.append({**head, "task_type": "all", **blank, **tail})
            continue
        groups = {"all": record, **record["per_task_type"]}
        for task, summary in groups.items():
            values = {k: summary[k] for k in figures}
            values |= {k: summary.get(AGENT_FIGURES, {}).get(k, "") for k in own}
            rows.append({**head, "task_type": task, **values, **tail})
    return rows


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _bar_chart(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[tuple[float, float, float]]],
    ylabel: str,
) -> None:
    """Grouped bars: `series[label][i]` = (value, error below, error above) of `groups[i]`."""
    # Imported here: pyplot takes about a second to load and only the charts need it, and the
    # file-only Agg backend must be chosen before pyplot is first imported.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) * max(1, len(series))), 4.5))
    for k, (label, values) in enumerate(series.items()):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(groups))]
        heights = [v[0] for v in values]
        errors = [[v[1] for v in values], [v[2] for v in values]]
        ax.bar(xs, heights, width, yerr=errors, capsize=3, label=label)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(output_dir: Path, results: Mapping[str, Any]) -> dict[str, Path]:
    """Write results.json, results.csv, results.md and results.png; return their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: output_dir / f"results.{ext}" for ext in ("json", "csv", "md", "png")}
    paths["json"].write_text(json.dumps(results, indent=2) + "\n")
    _write_csv(paths["csv"], _results_rows(results))
    paths["md"].write_text(_results_markdown(results))
    suites = {name: record for name, record in results["suites"].items() if _ran(record)}
    _bar_chart(
        paths["png"],
        f"{results['label']}: success rate (95% CI)",
        list(suites),
        {
            results["label"]: [
                (
                    r["success_rate"],
                    r["success_rate"] - r["ci_low"],
                    r["ci_high"] - r["success_rate"],
                )
                for r in suites.values()
            ]
        },
        "success rate",
    )
    return paths


# ---------------------------------------------------------------------------------------------
# Aggregation over runs and seeds
# ---------------------------------------------------------------------------------------------


def find_results(inputs: Iterable[str]) -> list[Path]:
    """results.json files named by `inputs`: files, folders (searched recursively) or globs.

    Raises:
        FileNotFoundError: when an input matches nothing.
    """
    found: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_file():
            matches = [path]
        elif path.is_dir():
            matches = sorted(path.rglob(RESULTS_FILE))
        else:
            anchor = Path(path.anchor) if path.is_absolute() else Path(".")
            pattern = str(path.relative_to(anchor)) if path.is_absolute() else str(path)
            matches = sorted(
                p if p.is_file() else p / RESULTS_FILE
                for p in anchor.glob(pattern)
                if p.is_file() or (p / RESULTS_FILE).is_file()
            )
        if not matches:
            raise FileNotFoundError(f"no {RESULTS_FILE} found at {item!r}")
        found.extend(m for m in matches if m not in found)
    return found


def read_results(path: Path) -> dict[str, Any]:
    """One `results.json`, checked for what `aggregate` reads: a `label`, `eval.level`, and
    `suites` whose records that ran have a numeric `success_rate` and `episodes`.

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    where = f"{path} is not a results.json of scripts/post_training_tests.py"
    try:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{where} ({_first_line(error)})") from None
    suites = results.get("suites") if isinstance(results, dict) else None
    if not isinstance(suites, dict):
        raise ValueError(f"{where} (no `suites` object)")
    if not isinstance(results.get("label"), str):
        raise ValueError(f"{where} (no `label` text)")
    if not isinstance(results.get("eval"), dict) or not isinstance(
        results["eval"].get("level"), str
    ):
        raise ValueError(f"{where} (no `eval.level` text)")
    for name, record in suites.items():
        if not isinstance(record, dict):
            raise ValueError(f"{where} (suite {name!r} is not an object)")
        if not _ran(record):
            continue
        optional = [name for name in ("ci_low", "ci_high") if name in record]
        for field_name in ("success_rate", "episodes", *optional):
            value = record.get(field_name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(
                    f"{where} (suite {name!r}: {field_name} is {value!r}, not a number)"
                )
    return results


def check_baseline(results: Sequence[Mapping[str, Any]], baseline: str) -> None:
    """Refuse a `baseline` suite that none of `results` played: every change would be blank.

    Raises:
        ValueError: naming the suites the results do hold.
    """
    played = {
        name for result in results for name, record in result["suites"].items() if _ran(record)
    }
    if baseline not in played:
        raise ValueError(
            f"baseline={baseline!r} is not a suite any input played; they hold "
            f"{', '.join(sorted(played)) or 'no suite that ran'}: pass one of them as baseline"
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@dataclass(frozen=True)
class AggregateRow:
    """One (agent label, suite) cell of the paper-style table."""

    label: str
    suite: str
    runs: int
    """results.json files (seeds) averaged."""
    mean: float
    """Mean success rate over the runs."""
    std: float
    """Standard deviation of the success rate over the runs (0 for a single run)."""
    change_pct: float | None
    """100 * (mean - baseline mean) / baseline mean; None without a baseline (or at 0)."""
    episodes: int
    """Episodes over all runs."""
    ci: tuple[float, float] | None = None
    """A single run's 95% Wilson interval (`ci_low`, `ci_high`), when its results.json has it:
    with one run there is no spread over runs, but the episodes still bound the rate."""


def _table_labels(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The column of each results.json: its label, and its level when several levels are read
    (runs on the training level and on the held-out pairs are never averaged together)."""
    several_levels = len({result["eval"]["level"] for result in results}) > 1
    return [
        result["label"]
        + (f" ({result['eval']['level'].removeprefix('BabyAI-')})" if several_levels else "")
        for result in results
    ]


def aggregate(
    results: Sequence[Mapping[str, Any]], baseline: str = "no_change"
) -> list[AggregateRow]:
    """Per label and suite, mean and spread of success over runs, and change vs `baseline`."""
    rates: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    episodes: dict[tuple[str, str], int] = defaultdict(int)
    intervals: dict[tuple[str, str], tuple[float, float] | None] = {}
    for label, result in zip(_table_labels(results), results, strict=True):
        for suite, record in result["suites"].items():
            if not _ran(record):
                continue  # listed apart (`excluded_suites`), never averaged as a 0
            rates[label][suite].append(record["success_rate"])
            episodes[label, suite] += record["episodes"]
            has_ci = "ci_low" in record and "ci_high" in record
            intervals[label, suite] = (record["ci_low"], record["ci_high"]) if has_ci else None
    rows = []
    for label, suites in rates.items():
        base = suites.get(baseline)
        base_mean = sum(base) / len(base) if base else None
        for suite, values in suites.items():
            mean = sum(values) / len(values)
            var = (
                sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
            )
            change = 100 * (mean - base_mean) / base_mean if base_mean else None
            single_ci = intervals[label, suite] if len(values) == 1 else None
            rows.append(
                AggregateRow(
                    label,
                    suite,
                    len(values),
                    mean,
                    math.sqrt(var),
                    change,
                    episodes[label, suite],
                    single_ci,
                )
            )
    return rows


def excluded_suites(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(label, suite) -> reason, for the suites `aggregate` leaves out as not applicable."""
    return {
        (label, suite): reason
        for label, result in zip(_table_labels(results), results, strict=True)
        for suite, reason in not_applicable(result).items()
    }


def _aggregate_markdown(
    rows: Sequence[AggregateRow], baseline: str, excluded: Mapping[tuple[str, str], str]
) -> str:
    labels = list(dict.fromkeys(row.label for row in rows))
    suites = list(dict.fromkeys(row.suite for row in rows))
    cell = {(row.label, row.suite): row for row in rows}
    lines = [
        f"Success rate, mean ± standard deviation over runs (n = runs; a single run shows its "
        f"95% Wilson interval instead), and the change against `{baseline}`.",
        "",
        "| suite | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for suite in suites:
        cells = []
        for label in labels:
            row = cell.get((label, suite))
            if row is None:
                cells.append("not applicable" if (label, suite) in excluded else "–")
                continue
            if row.ci is not None:
                text = f"{row.mean:.3f} [{row.ci[0]:.3f}, {row.ci[1]:.3f}] (n=1)"
            else:
                text = f"{row.mean:.3f} ± {row.std:.3f} (n={row.runs})"
            if row.change_pct is not None and suite != baseline:
                text += f" {row.change_pct:+.0f}%"
            cells.append(text)
        lines.append(f"| {suite} | " + " | ".join(cells) + " |")
    if excluded:
        lines += ["", "Not applicable, left out of the table, the means and the chart:", ""]
        reasons = defaultdict(list)
        for (label, suite), reason in excluded.items():
            reasons[suite, reason].append(label)
        for (suite, reason), names in reasons.items():
            lines.append(f"- {suite} ({', '.join(names)}): {reason}")
    return "\n".join(lines) + "\n"


def write_aggregate(
    output_dir: Path,
    rows: Sequence[AggregateRow],
    *,
    baseline: str,
    title: str,
    excluded: Mapping[tuple[str, str], str] | None = None,
) -> dict[str, Path]:
    """Write summary.md, summary.csv and summary.png; return their paths.

    `excluded` (`excluded_suites`) are listed with their reasons in summary.md, nowhere else.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {name.rsplit(".", 1)[1]: output_dir / name for name in SUMMARY_FILES}
    markdown = _aggregate_markdown(rows, baseline, excluded or {})
    paths["md"].write_text(f"# {title}\n\n" + markdown)
    _write_csv(
        paths["csv"],
        [
            {
                **{k: v for k, v in row.__dict__.items() if k != "ci"},
                "single_run_ci_low": row.ci[0] if row.ci else "",
                "single_run_ci_high": row.ci[1] if row.ci else "",
            }
            for row in rows
        ],
    )
    suites = list(dict.fromkeys(row.suite for row in rows))
    cell = {(row.label, row.suite): row for row in rows}
    series = {}
    for label in dict.fromkeys(row.label for row in rows):
        values = []
        for suite in suites:
            row = cell.get((label, suite))
            if row is None:
                values.append((math.nan, 0.0, 0.0))
            elif row.ci is not None:
                values.append((row.mean, row.mean - row.ci[0], row.ci[1] - row.mean))
            else:
                values.append((row.mean, row.std, row.std))
        series[label] = values
    title = f"{title} (mean ± std over runs; one run: its 95% CI)"
    _bar_chart(paths["png"], title, suites, series, "success rate")
    return paths
