"""glam.campaign without SLURM: expansion, validation, rendering, submission.

    .venv/bin/python -m pytest tests/test_campaign.py

Submission runs against a stand-in `sbatch` on PATH that records its arguments.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import glam.campaign as glam_campaign

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "launch_campaign.py"
CAMPAIGN_DIR = REPO_ROOT / "configs" / "campaign"

MINIMAL = {"name": "c", "preset": "tiny", "seeds": [1]}


def write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def directives(script: str) -> list[str]:
    return re.findall(r"^#SBATCH (\S+)$", script, flags=re.MULTILINE)


def script_arguments(script: str) -> list[str]:
    """The training/evaluation arguments a rendered script passes on (its `set --` line)."""
    (line,) = [line for line in script.splitlines() if line.startswith("set -- ")]
    return shlex.split(line)[2:]


@pytest.mark.parametrize("path", sorted(CAMPAIGN_DIR.glob("*.yaml")), ids=lambda path: path.name)
def test_every_campaign_file_loads_checks_and_renders_valid_bash(
    path: Path, tmp_path: Path
) -> None:
    campaign = glam_campaign.load_campaign(path)
    jobs = glam_campaign.plan_jobs(campaign, tmp_path)
    assert jobs
    # Every arm's config fits its script's schema: the training jobs of the first seed (the
    # other seeds' differ only in train.seed and their folders), and the first arm's evaluation
    # of each level (the others differ only in the run they read). Composing a config costs
    # 0.2-0.4 s of Hydra, and `launch_campaign.py` checks every job before it starts any.
    seed = f"seed-{campaign.seeds[0]} "
    first = [job for job in jobs if job.label.startswith(seed) or f"_{seed}" in job.label]
    assert first and len(first) * len(campaign.seeds) == len(jobs)
    train = [job for job in first if job.after is None]
    evaluations = [job for job in first if job.after is not None]
    levels = len(campaign.evaluation.levels) if campaign.evaluation else 0
    assert len(evaluations) == len(train) * levels
    checked = train + evaluations[:levels]
    assert glam_campaign.check_jobs(checked) == []
    for job in jobs:
        check = subprocess.run(["bash", "-n"], input=job.script, text=True, capture_output=True)
        assert check.returncode == 0, f"{job.label}: {check.stderr}"


def test_templates_are_valid_bash() -> None:
    for path in [*REPO_ROOT.glob("slurm/**/*.sbatch"), *REPO_ROOT.glob("slurm/**/*.sh")]:
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, f"{path}: {check.stderr}"


def test_paper_campaign_is_one_requeueable_8_gpu_job_per_seed(tmp_path: Path) -> None:
    campaign = glam_campaign.load_campaign(CAMPAIGN_DIR / "glam_paper.yaml")
    jobs = glam_campaign.plan_jobs(campaign, tmp_path)
    train = [job for job in jobs if job.label.endswith(" train")]
    evals = [job for job in jobs if job.after is not None]
    assert len(train) == len(campaign.seeds) >= 2
    assert len(evals) == len(train) * len(campaign.evaluation.levels)

    for seed, job in zip(campaign.seeds, train, strict=True):
        options = directives(job.script)
        assert {"--nodes=1", "--gpus-per-node=8", "--requeue", "--signal=B:USR1@600"} <= set(
            options
        )
        arguments = script_arguments(job.script)
        assert arguments[:2] == ["--config-name", "glam_paper"]
        assert {"env.num_envs=32", "train.total_frames=1500000", f"train.seed={seed}"} <= set(
            arguments
        )
        assert f"train.output_dir={tmp_path}/glam_paper/seed-{seed}" in arguments
        assert "train.resume=true" in job.script
        assert "--multi_gpu" not in job.script  # the layout is computed in the job
        assert "export GLAM_GPUS_PER_NODE=8" in job.script

    first_eval = evals[0]
    assert first_eval.after is train[0]
    assert "--dependency=afterok:<job id of seed-1 train>" in first_eval.sbatch_command()
    options = directives(first_eval.script)
    assert "--gpus-per-node=1" in options and "--requeue" not in options
    assert f"agent.path={tmp_path}/glam_paper/seed-1" in script_arguments(first_eval.script)
    # Every suite on the training tasks, only the unchanged prompt on the held-out pairs.
    by_level = {
        next(a for a in script_arguments(job.script) if a.startswith("eval.level=")): job
        for job in evals[:2]
    }
    train_level = script_arguments(by_level["eval.level=BabyAI-MixedTrainLocal-v0"].script)
    test_level = script_arguments(by_level["eval.level=BabyAI-MixedTestLocal-v0"].script)
    assert not any(a.startswith("eval.suites=") for a in train_level)
    assert "eval.suites=[no_change]" in test_level
    with pytest.raises(
        glam_campaign.CampaignError, match="not in evaluation.levels: BabyAI-GoTo-v0"
    ):
        glam_campaign.EvaluationConfig(
            levels=["BabyAI-MixedTestLocal-v0"], suites={"BabyAI-GoTo-v0": []}
        )


def test_grid_is_the_cartesian_product_times_the_seeds(tmp_path: Path) -> None:
    campaign = glam_campaign.load_campaign(
        write_yaml(
            tmp_path / "grid.yaml",
            {
                **MINIMAL,
                "seeds": [1, 2],
                "overrides": {"env.name": "BabyAI-GoToLocal-v0"},
                "grid": {"ppo.lr": [1e-6, 1e-5], "model.name_or_path": ["/m/a b", "t5"]},
            },
        )
    )
    runs = glam_campaign.expand_runs(campaign, tmp_path)
    assert [run.name for run in runs] == [
        f"ppo.lr-{lr}_model.name_or_path-{model}_seed-{seed}"
        for lr in ("1e-06", "1e-05")
        for model in ("m-a-b", "t5")
        for seed in (1, 2)
    ]
    assert len({run.output_dir for run in runs}) == 8
    arguments = runs[2].training_arguments(campaign)
    assert arguments == [
        "--config-name",
        "tiny",
        "env.name=BabyAI-GoToLocal-v0",
        "ppo.lr=1e-06",
        "model.name_or_path=t5",
        "train.seed=1",
        f"train.output_dir={tmp_path}/c/{runs[2].name}",
    ]
    assert "model.name_or_path='/m/a b'" in runs[0].training_arguments(campaign)


def test_arms_times_grid_times_seeds_each_labelled_and_named_by_its_arm(tmp_path: Path) -> None:
    campaign = glam_campaign.load_campaign(
        write_yaml(
            tmp_path / "arms.yaml",
            {
                **MINIMAL,
                "seeds": [1, 2],
                "overrides": {"ppo.lr": 1e-3, "train.total_frames": 64},
                "arms": {
                    "default": {},
                    "regime": {"env.num_envs": 8, "ppo.frames_per_env": 32, "ppo.lr": 1e-2},
                    "own-label": {"train.label": "mine"},
                },
                "grid": {"env.nbr_obs": [1, 2]},
            },
        )
    )
    runs = glam_campaign.expand_runs(campaign, tmp_path)
    assert [run.name for run in runs] == [
        f"{arm}_env.nbr_obs-{obs}_seed-{seed}"
        for arm in ("default", "regime", "own-label")
        for obs in (1, 2)
        for seed in (1, 2)
    ]
    assert [run.arm for run in runs[::4]] == ["default", "regime", "own-label"]
    assert runs[0].training_overrides(campaign) == [
        "ppo.lr=0.001",
        "train.total_frames=64",
        "train.label=default",
        "env.nbr_obs=1",
        "train.seed=1",
        f"train.output_dir={tmp_path}/c/default_env.nbr_obs-1_seed-1",
    ]
    # The arm's value replaces the campaign's in place; its own keys and label follow.
    assert runs[7].training_overrides(campaign) == [
        "ppo.lr=0.01",
        "train.total_frames=64",
        "env.num_envs=8",
        "ppo.frames_per_env=32",
        "train.label=regime",
        "env.nbr_obs=2",
        "train.seed=2",
        f"train.output_dir={tmp_path}/c/regime_env.nbr_obs-2_seed-2",
    ]
    # An arm that labels itself keeps its label.
    assert [a for a in runs[8].training_overrides(campaign) if a.startswith("train.label=")] == [
        "train.label=mine"
    ]

    jobs = glam_campaign.plan_jobs(campaign, tmp_path)
    assert len(jobs) == 3 * 2 * 2
    configs, errors = glam_campaign.compose_jobs(jobs)
    assert errors == []
    assert [(c.train.label, c.ppo.lr, c.env.num_envs, c.env.nbr_obs) for c in configs[3:5]] == [
        ("default", 1e-3, 4, 2),
        ("regime", 1e-2, 8, 1),
    ]
    assert configs[-1].train.label == "mine"
    assert (
        jobs[4].script_path == tmp_path / "c" / "slurm" / "regime_env.nbr_obs-1_seed-1.train.sbatch"
    )
    assert "train.label=regime" in script_arguments(jobs[4].script)


def test_arms_without_a_grid_name_runs_by_arm_and_seed(
    fake_sbatch: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    level = "BabyAI-GoToRedBallNoDists-v0"
    path = write_yaml(
        tmp_path / "c.yaml",
        {
            **MINIMAL,
            "arms": {"default": {}, "lr-5e-4": {"ppo.lr": 5e-4}},
            "evaluation": {"levels": [level], "episodes": 10},
        },
    )
    assert glam_campaign.launch(path, output_root=tmp_path / "runs") == 0
    assert re.findall(r"^submitted (.*): job (\d+)$", capsys.readouterr().out, re.MULTILINE) == [
        ("default_seed-1 train", "101"),
        (f"default_seed-1 eval {level}", "102"),
        ("lr-5e-4_seed-1 train", "103"),
        (f"lr-5e-4_seed-1 eval {level}", "104"),
    ]
    slurm_dir = tmp_path / "runs" / "c" / "slurm"
    calls = fake_sbatch.read_text().splitlines()
    assert (
        calls[3]
        == f"--parsable --dependency=afterok:103 {slurm_dir}/lr-5e-4_seed-1.eval.{level}.sbatch"
    )
    arguments = script_arguments((slurm_dir / "lr-5e-4_seed-1.train.sbatch").read_text())
    assert arguments[:2] == ["--config-name", "tiny"]
    assert {"ppo.lr=0.0005", "train.label=lr-5e-4", "train.seed=1"} <= set(arguments)
    assert f"train.output_dir={tmp_path}/runs/c/lr-5e-4_seed-1" in arguments
    evaluation = script_arguments((slurm_dir / f"lr-5e-4_seed-1.eval.{level}.sbatch").read_text())
    assert f"agent.path={tmp_path}/runs/c/lr-5e-4_seed-1" in evaluation


def test_a_key_given_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """YAML keeps the last of two equal keys without a word: two arms of one name would be one."""
    path = tmp_path / "twice.yaml"
    path.write_text(
        "name: c\npreset: tiny\nseeds: [1]\narms:\n  a: {ppo.lr: 1.0e-3}\n  a: {ppo.lr: 1.0e-4}\n"
    )
    assert glam_campaign.launch(path, dry_run=True) == 2
    assert "line 6: key 'a' is given twice in one mapping" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "true"),
        (None, "null"),
        (3, "3"),
        (1e-6, "1e-06"),
        ("BabyAI-MixedTestLocal-v0", "BabyAI-MixedTestLocal-v0"),
        (["no_change", "french"], "[no_change,french]"),
        ("it's", "'it\\'s'"),
        ({"a": 1}, "{a:1}"),
    ],
)
def test_override_values_use_hydra_syntax(value: object, expected: str) -> None:
    assert glam_campaign.format_override_value(value) == expected


def test_multi_node_template_is_picked_for_several_nodes(tmp_path: Path) -> None:
    campaign = glam_campaign.load_campaign(CAMPAIGN_DIR / "glam_paper_multi_node.yaml")
    (job, *_) = glam_campaign.plan_jobs(campaign, tmp_path)
    assert "from slurm/train_multi_node.sbatch" in job.script
    assert {"--nodes=2", "--gpus-per-node=4"} <= set(directives(job.script))
    assert '--machine_rank "$SLURM_NODEID"' in job.script
    assert "scontrol show hostnames" in job.script


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": [1]}, "unknown key(s) seed; known in the file: name, preset, seeds"),
        ({"slurm": {"gpus": 8}}, "unknown key(s) slurm.gpus"),
        ({"grid": {}}, "grid is empty"),
        ({"grid": {"ppo.lr": []}}, "grid.ppo.lr must be a non-empty list"),
        ({"grid": {"ppo.lr": 1e-5}}, "grid.ppo.lr must be a non-empty list"),
        ({"overrides": {"train.seed": 3}}, "train.seed is set by the launcher"),
        ({"overrides": {"a": 1}, "grid": {"a": [2]}}, "keys in both overrides and grid"),
        ({"seeds": []}, "seeds must be a non-empty list"),
        ({"seeds": [1, 1]}, "seeds has duplicates"),
        ({"name": "a b"}, "name 'a b' may only hold"),
        ({"slurm": {"time": "soon"}}, "slurm.time 'soon' is not a SLURM time"),
        ({"slurm": {"time": "5", "signal_seconds": 300}}, "below the time limit (5 = 300 s)"),
        ({"slurm": {"template": "nope"}}, "slurm.template 'nope' is not one of"),
        ({"slurm": {"template": "train_one_node", "nodes": 2}}, "use train_multi_node"),
        ({"slurm": {"template": "evaluate"}}, "'evaluate' is not a training template"),
        ({"evaluation": {"levels": []}}, "evaluation.levels is empty"),
        ({"evaluation": {"slurm": {"gpu": 1}}}, "unknown key(s) evaluation.slurm.gpu"),
        ({"slurm": {"nodes": "2"}}, "slurm.nodes must be int, got '2'"),
        ({"slurm": {"mem": True}}, "slurm.mem must be str or null, got True"),
        ({"overrides": ["a=1"]}, "overrides must be a mapping, got ['a=1']"),
        ({"seeds": [1, "2"]}, "seeds must be a non-empty list of integers"),
        ({"grid": {"a": ["x/y", "x-y"]}}, "same run folder twice"),
        ({"script": "scripts/nope.py"}, "script 'scripts/nope.py' is not a training script"),
        ({"script": "scripts/post_training_tests.py"}, "is not a training script of"),
        ({"arms": {}}, "arms is empty"),
        ({"arms": ["a"]}, "arms must be a mapping or null, got ['a']"),
        ({"arms": {"a b": {}}}, "arm name 'a b' is not a folder name"),
        ({"arms": {".a": {}}}, "arm name '.a' is not a folder name"),
        ({"arms": {1: {}}}, "arm name 1 is not a folder name"),
        ({"arms": {"a": None}}, "arms.a must be a mapping of overrides ({} for the preset"),
        ({"arms": {"a": {"train.seed": 2}}}, "arms.a: train.seed is set by the launcher"),
        ({"arms": {"a": {"+train.output_dir": "x"}}}, "arms.a: +train.output_dir is set by the"),
        ({"arms": {"a": {"ppo lr": 1}}}, "arms.a: 'ppo lr' is not a Hydra override key"),
        (
            {"arms": {"a": {}, "b": {"ppo.lr": 1e-3}}, "grid": {"ppo.lr": [1e-4, 1e-3]}},
            "arms.b sets ppo.lr, which the grid varies",
        ),
        ({"arms": {"a": {}, "A": {}}}, "arm names ['A', 'a'] differ only in case"),
        (
            {"arms": {"a": {}}, "overrides": {"train.label": "x"}},
            "train.label in overrides: with arms, each run is labelled with its arm's name",
        ),
    ],
)
def test_bad_campaign_exits_2_with_the_reason(
    change: dict, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "bad.yaml", {**MINIMAL, **change})
    assert glam_campaign.launch(path, dry_run=True) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {path}: ")
    assert message in error


def test_the_training_script_is_a_campaign_key_checked_against_its_own_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_yaml(tmp_path / "c.yaml", MINIMAL)
    (job,) = glam_campaign.plan_jobs(glam_campaign.load_campaign(path), tmp_path)
    assert job.config.entry_point == "scripts/train_language_agent.py"
    assert "export GLAM_TRAIN_SCRIPT=scripts/train_language_agent.py" in job.script
    # slurm.env still wins in the batch script (stand-ins such as slurm/local/fake_trainer.py).
    stand_in = {**MINIMAL, "slurm": {"env": {"GLAM_TRAIN_SCRIPT": "slurm/local/fake_trainer.py"}}}
    (job,) = glam_campaign.plan_jobs(
        glam_campaign.load_campaign(write_yaml(tmp_path / "s.yaml", stand_in)), tmp_path
    )
    assert "export GLAM_TRAIN_SCRIPT=slurm/local/fake_trainer.py" in job.script
    assert "GLAM_TRAIN_SCRIPT=scripts/train_language_agent.py" not in job.script

    # Another script, with another schema: one entry in ENTRY_POINTS, and its jobs compose with
    # that schema (the results table's has no `train` section, so train.seed is unknown).
    monkeypatch.setitem(
        glam_campaign.ENTRY_POINTS,
        "scripts/test_results.py",
        glam_campaign.EntryPoint("train", "glam.eval.config:ResultsTableConfig", "configs/eval"),
    )
    other = write_yaml(
        tmp_path / "o.yaml",
        {**MINIMAL, "preset": "test_results", "script": "scripts/test_results.py"},
    )
    (job,) = glam_campaign.plan_jobs(glam_campaign.load_campaign(other), tmp_path)
    assert "export GLAM_TRAIN_SCRIPT=scripts/test_results.py" in job.script
    (error,) = glam_campaign.check_jobs([job])
    assert error.startswith("seed-1 train: unknown key train") and "valid keys" in error
    assert (
        glam_campaign.check_jobs(
            glam_campaign.plan_jobs(glam_campaign.load_campaign(path), tmp_path)
        )
        == []
    )


def test_missing_campaign_file_fails_from_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "nope.yaml")], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "nope.yaml: no such campaign file" in result.stderr
    assert result.stdout == ""


def test_dry_run_prints_scripts_and_commands_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output_root = tmp_path / "runs"
    code = glam_campaign.launch(
        CAMPAIGN_DIR / "tiny_local.yaml", output_root=output_root, dry_run=True
    )
    assert code == 0
    out = capsys.readouterr().out
    slurm_dir = output_root / "tiny_local" / "slurm"
    commands = re.findall(r"^\$ (.*)$", out, flags=re.MULTILINE)
    assert commands == [
        f"sbatch --parsable {slurm_dir}/ppo.lr-0.0001_seed-1.train.sbatch",
        f"sbatch --parsable {slurm_dir}/ppo.lr-0.001_seed-1.train.sbatch",
    ]
    assert out.count("#!/usr/bin/env bash") == 2
    assert "set -- --config-name tiny ppo.lr=0.0001 train.seed=1" in out
    assert "dry run: 2 job(s) checked, nothing written or submitted" in out
    assert not output_root.exists()


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `sbatch` that logs its arguments and answers job ids 101, 102, ..."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch_calls.txt"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        f'[[ -z ${{FAIL_SBATCH:-}} ]] || {{ echo "sbatch: error: no partition" >&2; exit 1; }}\n'
        f"echo $((100 + $(wc -l < {calls})))\n"
    )
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_submit_writes_scripts_prints_ids_and_chains_evaluations(
    fake_sbatch: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = "BabyAI-GoToLocal-v0", "BabyAI-PickupLoc-v0"
    path = write_yaml(
        tmp_path / "c.yaml",
        {**MINIMAL, "seeds": [1, 2], "evaluation": {"levels": [a, b], "episodes": 10}},
    )
    assert glam_campaign.launch(path, output_root=tmp_path / "runs") == 0
    out = capsys.readouterr().out
    assert re.findall(r"^submitted (.*): job (\d+)$", out, flags=re.MULTILINE) == [
        ("seed-1 train", "101"),
        (f"seed-1 eval {a}", "102"),
        (f"seed-1 eval {b}", "103"),
        ("seed-2 train", "104"),
        (f"seed-2 eval {a}", "105"),
        (f"seed-2 eval {b}", "106"),
    ]
    slurm_dir = tmp_path / "runs" / "c" / "slurm"
    calls = fake_sbatch.read_text().splitlines()
    assert calls[0] == f"--parsable {slurm_dir}/seed-1.train.sbatch"
    assert calls[5] == f"--parsable --dependency=afterok:104 {slurm_dir}/seed-2.eval.{b}.sbatch"
    assert (slurm_dir / "seed-2.train.sbatch").read_text().startswith("#!/usr/bin/env bash")
    assert (slurm_dir / "jobs.tsv").read_text().splitlines()[3].startswith("104\tseed-2 train\t")


def test_sbatch_failure_stops_with_its_message(
    fake_sbatch: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FAIL_SBATCH", "1")
    path = write_yaml(tmp_path / "c.yaml", {**MINIMAL, "seeds": [1, 2]})
    assert glam_campaign.launch(path, output_root=tmp_path / "runs") == 1
    assert "sbatch failed for seed-1 train (exit 1): sbatch: error: no partition" in (
        capsys.readouterr().err
    )
    assert len(fake_sbatch.read_text().splitlines()) == 1  # it stopped at the first failure


@pytest.mark.parametrize(
    ("change", "messages"),
    [
        (
            {"seeds": [1, 2], "grid": {"ppo.lrr": [1e-4, 1e-3]}},
            ["unknown key ppo.lrr (did you mean ppo.lr?); valid keys of ppo: lr, lr_schedule"],
        ),
        ({"preset": "tiny-nope"}, ["Cannot find primary config 'tiny-nope'", "tiny"]),
        ({"overrides": {"ppo.gamma": 1.5}}, ["ppo.gamma must be in [0, 1], got 1.5"]),
        (
            {"evaluation": {"levels": ["A"], "overrides": {"eval.episode": 3}}},
            ["seed-1 eval A: unknown key eval.episode (did you mean eval.episodes?)"],
        ),
        # The schema checks types and ranges; these once passed --dry-run and failed on the
        # cluster, job after job.
        (
            {"seeds": [1, 2], "grid": {"env.name": ["BabyAI-GoToRedBal-v0"]}},
            [
                "env.name-BabyAI-GoToRedBal-v0_seed-1 train, env.name-BabyAI-GoToRedBal-v0_seed-2 "
                "train: env.name='BabyAI-GoToRedBal-v0' is not a BabyAI level (did you mean "
                "BabyAI-GoToRedBall-v0?)"
            ],
        ),
        (
            {"grid": {"env.action_space": ["navv"]}},
            ["env.action_space='navv' is not one of ['default', 'french', 'nav', 'noop'"],
        ),
        (
            {"grid": {"model.name_or_path": ["smollm2-135"]}},
            [
                "model.name_or_path: 'smollm2-135' is neither an embedded model (smollm2-135m, gemma3-270m)"
            ],
        ),
        (
            {"evaluation": {"levels": ["BabyAI-Nope-v0"]}},
            ["seed-1 eval BabyAI-Nope-v0: eval.level='BabyAI-Nope-v0' is not a BabyAI level"],
        ),
        (
            {"overrides": {"model.lora.layers": [99]}},
            ["model.lora.layers=[99]: the model's layers are 0 to 1 ([99] outside)"],
        ),
        (
            {"grid": {"model.lora.layers": [5]}},
            ["model.lora.layers=5: the model has 2 layers"],
        ),
        (
            {"arms": {"default": {}, "lr": {"ppo.lrr": 1e-3}}},
            # Only the arm's job is named, on a line of its own.
            ["of 1 kind(s)", "\n  lr_seed-1 train: unknown key ppo.lrr (did you mean ppo.lr?)"],
        ),
    ],
    ids=[
        "unknown_grid_key",
        "unknown_preset",
        "invalid_value",
        "unknown_evaluation_key",
        "unknown_level",
        "unknown_action_space",
        "unknown_model",
        "unknown_evaluation_level",
        "lora_layer_outside_the_model",
        "more_lora_layers_than_the_model",
        "unknown_arm_key",
    ],
)
def test_every_job_config_is_checked_before_anything_is_submitted(
    change: dict,
    messages: list[str],
    fake_sbatch: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_yaml(tmp_path / "bad.yaml", {**MINIMAL, **change})
    assert glam_campaign.launch(path, output_root=tmp_path / "runs", dry_run=True) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {path}: invalid configuration")
    for message in messages:
        assert message in error
    # Submitting checks the same way first: no sbatch call, no folder.
    assert glam_campaign.launch(path, output_root=tmp_path / "runs") == 2
    assert not fake_sbatch.exists() and not (tmp_path / "runs").exists()


def test_a_grid_error_names_every_job_it_hits_once(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "bad.yaml", {**MINIMAL, "seeds": [1, 2], "grid": {"+ppo.lrr": [1e-4]}}
    )
    (line,) = glam_campaign.check_jobs(
        glam_campaign.plan_jobs(glam_campaign.load_campaign(path), tmp_path)
    )
    assert line.startswith("ppo.lrr-0.0001_seed-1 train, ppo.lrr-0.0001_seed-2 train: ")
    assert "unknown key ppo.lrr" in line


def test_dry_run_of_an_unknown_key_fails_from_the_command_line(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "bad.yaml", {**MINIMAL, "grid": {"ppo.lrr": [1e-3]}})
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "--dry-run"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "unknown key ppo.lrr" in result.stderr
    assert "dry run" not in result.stdout
