"""A short look at the whole stack on CPU: what `make demo` runs.

    python scripts/demo.py                       # 3-5 min alone on a 2-core CPU (README)
    python scripts/demo.py --updates 16 --output-dir runs/demo16    # 4,096 frames

1. loads the embedded SmolLM2-135M-Instruct (converted once into the safetensors cache) and
   plays held-out episodes with the untrained policy and with the adapter the project ships,
   trained by the preset's own command (glam/data/demo_policy/record.json says which, with its
   figures), then prints one episode of the trained agent step by step;
2. resets a BabyAI-Text episode of the default preset and shows the prompt and the policy;
3. runs the main job, PPO with a LoRA adapter on the model's top 4 layers, the update run from
   the rollout's cached trunk (`scripts/train_language_agent.py`, preset `smollm2_lora_cpu`),
   for four updates of 256 frames, and prints what it measured from the run's `metrics.csv`:
   the last update's figures and the training success of every update;
4. scores the first step's prompt again with the trained checkpoint and shows the policy
   before and after, and draws the run's learning curve (`learning_curve.png` in the run folder).
Four updates move the first step's policy but do not yet show in success (the
shipped adapter shows what the full run reaches): the preset's full runs passed 0.5 smoothed training success after 3,328 and 3,840 frames (13 and 15
updates) and 0.9 after 5,632, and solve the level on held-out episodes (docs/training.md).
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

from glam.cli import report
from glam.runs.folder import policy_dir
from glam.threads import set_torch_threads

ROOT = Path(__file__).resolve().parent.parent
PRESET = "smollm2_lora_cpu"
DEMO_MARK = "demo.txt"
"""The file that marks a run folder as the demo's own: the only folder a new demo replaces."""
UPDATES = 4
"""Live PPO updates: the demo's whole budget is 3 minutes of a 2-core CPU."""
EPISODES = 10
"""Held-out episodes played by the untrained and the trained policy."""
FRAMES_PER_ENV = 32
FULL_RUN = (
    "[demo] a few updates move the policy but are too few to show in success. The preset's full "
    "run (24 updates, 27 minutes here; two seeds) passed 0.5 smoothed training success after "
    "3,328 and 3,840 frames, 0.9 after 5,632, and solved 98 and 100 of 100 held-out episodes: "
    "`python scripts/train_language_agent.py train.output_dir=runs/smollm2`, curves and "
    "figures in docs/training.md"
)
SHOWN = (
    ("charts/rollout_fps", "rollout env-steps/s"),
    ("charts/update_fps", "update transitions/s"),
    ("charts/success_rate", "success rate (episodes ended)"),
    ("charts/episode_return", "episode return (x env.reward_scale)"),
    ("losses/policy", "policy loss"),
    ("losses/value", "value loss"),
    ("losses/entropy", "entropy"),
    ("losses/approx_kl", "approx KL"),
)


def show_one_step() -> tuple[str, list[str], list[float], float]:
    """Score the actions for the first step of a seeded episode and print the policy; return the
    prompt, the actions, their probabilities and the value."""
    import torch
    from accelerate.utils import set_seed

    import babyai_text
    from glam.models.precision import resolve_autocast_bf16
    from glam.policy.llm_policy import LLMActorCritic
    from glam.policy.prompts import PromptHistory
    from glam.run_config import compose_run

    cfg = compose_run(PRESET)
    env_cfg, policy_cfg = cfg.env, cfg.policy
    env = babyai_text.make(env_cfg.name, action_space=env_cfg.action_space)
    obs, info = env.reset(seed=3)
    history = PromptHistory(nbr_obs=env_cfg.nbr_obs)
    history.add_observation(info["descriptions"])
    prompt = history.prompt(obs["mission"], env.action_words)
    # The run's initial policy: its precision (chosen as the trainer chooses it) and its seed
    # (the value head's initial weights), so that "before" and "after" differ by training only.
    cfg.model.autocast_bf16, _ = resolve_autocast_bf16(cfg.model.autocast_bf16, torch.device("cpu"))
    set_seed(cfg.train.seed)
    start = time.perf_counter()
    policy = LLMActorCritic.from_config(cfg.model, policy_cfg, env.action_words)
    print(f"[demo] loaded smollm2-135m + LoRA in {time.perf_counter() - start:.1f} s")
    with torch.no_grad():
        start = time.perf_counter()
        out = policy([prompt], [list(env.action_words)])
        seconds = time.perf_counter() - start
    probs = out.dist.probs[0]
    print("[demo] prompt:\n" + "\n".join("    " + line for line in prompt.splitlines()))
    print(
        f"[demo] policy: softmax(log-likelihood / {policy_cfg.temperature:g}), "
        f"{seconds:.2f} s to score {len(env.action_words)} actions; value {out.values[0]:.3f}:"
    )
    for word, p in zip(env.action_words, probs.tolist(), strict=True):
        print(f"    {word:<12} {p:6.3f}")
    return prompt, list(env.action_words), probs.tolist(), float(out.values[0])


def show_trained_agent(episodes: int) -> None:
    """Play `episodes` held-out episodes with the untrained policy and the shipped adapter, print
    their success beside the record's, then one episode of the trained policy step by step."""
    from glam.demo import demo_policy, play, read_record, success_of

    record = read_record()
    print(
        f"[demo] a trained agent: the adapter in glam/data/demo_policy, trained by\n"
        f"    {record['command']}\n"
        f"    at commit {record['commit']}: {record['frames']:,} frames in {record['updates']} "
        f"PPO updates, {record['train_minutes']:.0f} min on this project's 2-core CPU; "
        f"{record['held_out']['success_rate']:.2f} success on {record['held_out']['episodes']} "
        "held-out episodes"
    )
    print(f"[demo] {episodes} held-out episodes (seeded: the evaluation harness's), sampled:")
    print(
        f"    {'policy':<10} {'success':>8} {'95% interval':>15} {'mean length':>12} {'record':>7}"
    )
    trained = None
    for name in ("untrained", "trained"):
        policy = demo_policy(trained=name == "trained")
        start = time.perf_counter()
        found = success_of(play(policy, episodes))
        recorded = (
            record["demo"][name]["success_rate"] if episodes == record["demo"]["episodes"] else None
        )
        interval = f"[{found['ci_low']:.2f}, {found['ci_high']:.2f}]"
        print(
            f"    {name:<10} {found['success_rate']:8.2f} {interval:>15} "
            f"{found['mean_length']:12.1f} {'-' if recorded is None else f'{recorded:.2f}':>7}"
            f"   ({time.perf_counter() - start:.0f} s)"
        )
        trained = policy
    show_episode(trained)


def show_episode(policy) -> None:  # noqa: ANN001 (glam's policy, imported lazily)
    """One held-out episode of `policy`, its most probable action each step."""
    import torch

    import babyai_text
    from glam.demo import PRESET
    from glam.eval.config import SEED_BASE
    from glam.policy.prompts import PromptHistory
    from glam.run_config import compose_run

    cfg = compose_run(PRESET).env
    env = babyai_text.make(cfg.name, action_space=cfg.action_space)
    obs, info = env.reset(seed=SEED_BASE)
    history = PromptHistory(nbr_obs=cfg.nbr_obs)
    print(f"[demo] held-out episode {SEED_BASE}, the trained policy's most probable action:")
    print(f"    goal: {obs['mission']}")
    for step in range(1, env.unwrapped.max_steps + 1):
        history.add_observation(info["descriptions"])
        prompt = history.prompt(obs["mission"], env.action_words)
        with torch.no_grad():
            probs = policy([prompt], [list(env.action_words)]).dist.probs[0]
        action = int(probs.argmax())
        seen = "; ".join(info["descriptions"]) or "nothing"
        print(
            f"    {step:>2}. sees: {seen}\n        -> {env.action_words[action]} (p {probs[action]:.2f})"
        )
        history.add_action(env.action_words[action])
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            outcome = "reached the goal" if reward > 0 else "ran out of steps"
            print(f"    {outcome} in {step} steps (reward {reward:.2f})")
            break
    env.close()


def show_before_after(
    run_dir: Path, prompt: str, actions: list[str], before: list[float], value: float
) -> None:
    """Score the first step's prompt with the trained policy; print both policies side by side."""
    import torch

    from glam.policy.llm_policy import LLMActorCritic

    folder = policy_dir(run_dir)  # the newest checkpoint's
    policy = LLMActorCritic.from_pretrained(folder)
    policy.eval()
    with torch.no_grad():
        out = policy([prompt], [actions])
    after = out.dist.probs[0].tolist()
    print(f"[demo] the first step's policy, before and after training ({folder.parent.name}):")
    print(f"    {'action':<12} {'before':>7} {'after':>7} {'change':>7}")
    for word, p, q in zip(actions, before, after, strict=True):
        print(f"    {word:<12} {p:7.3f} {q:7.3f} {q - p:+7.3f}")
    print(f"    {'value':<12} {value:7.3f} {float(out.values[0]):7.3f}")


def read_rows(metrics_csv: Path) -> list[dict[str, str]]:
    with metrics_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise RuntimeError(f"{metrics_csv} has no rows")
    return rows


def number(row: dict[str, str], key: str) -> float:
    """A metric of a metrics.csv row; NaN where blank (no episode ended in that rollout)."""
    value = row.get(key)
    return float(value) if value not in (None, "") else math.nan


def show_success_by_update(rows: list[dict[str, str]]) -> None:
    """The training success of every update (over the episodes that ended in its rollout)."""
    print("[demo] training success by update (over the episodes that ended in its rollout):")
    print(f"    {'update':>6} {'frames':>7} {'episodes':>9} {'success':>8} {'return':>7}")
    for row in rows:
        episodes = int(number(row, "charts/episodes"))
        success, episode_return = (
            number(row, "charts/success_rate"),
            number(row, "charts/episode_return"),
        )
        shown = f"{success:8.2f} {episode_return:7.2f}" if episodes else f"{'-':>8} {'-':>7}"
        print(f"    {row['update']:>6} {row['frames']:>7} {episodes:>9} {shown}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=UPDATES, help="PPO updates to train")
    parser.add_argument(
        "--frames-per-env",
        type=int,
        default=FRAMES_PER_ENV,
        help="env-steps of each of the 8 envs per update",
    )
    parser.add_argument(
        "--episodes", type=int, default=EPISODES, help="held-out episodes of each policy (0: skip)"
    )
    parser.add_argument(
        "--output-dir", default="runs/demo", help="run folder (replaced if the demo wrote it)"
    )
    args = parser.parse_args()

    if args.episodes < 0 or args.updates < 1 or args.frames_per_env < 1:
        return report("--episodes must be >= 0, --updates and --frames-per-env >= 1")
    run_dir = ROOT / args.output_dir
    if run_dir.is_file() or (
        run_dir.is_dir() and any(run_dir.iterdir()) and not (run_dir / DEMO_MARK).is_file()
    ):  # before any work
        return report(
            f"--output-dir {args.output_dir} holds files the demo did not write (no "
            f"{DEMO_MARK}): the demo replaces only its own run folder; choose another"
        )
    # This process's own scoring (the episodes, the first step); the training is a process of
    # its own, which chooses again.
    print(f"[demo] {set_torch_threads(None, 'OMP_NUM_THREADS').describe()}")
    if args.episodes > 0:
        show_trained_agent(args.episodes)
    prompt, actions, before, value_before = show_one_step()
    frames = args.updates * args.frames_per_env * 8
    command = [
        sys.executable,
        str(ROOT / "scripts" / "train_language_agent.py"),
        "--config-name",
        PRESET,
        f"train.output_dir={run_dir}",
        f"train.total_frames={frames}",
        f"ppo.frames_per_env={args.frames_per_env}",
        f"train.save_every={args.updates}",
    ]
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / DEMO_MARK).write_text("written by scripts/demo.py, which replaces this folder\n")
    print("[demo] training:", " ".join(command[1:]))
    start = time.perf_counter()
    status = subprocess.call(command, cwd=ROOT)
    if status != 0:
        return report(f"the demo's training failed with exit status {status}", status=status)
    rows = read_rows(run_dir / "metrics.csv")
    row = rows[-1]
    print(
        f"[demo] trained {row['frames']} frames in {row['update']} PPO updates, "
        f"{time.perf_counter() - start:.0f} s in all. Last update:"
    )
    for key, label in SHOWN:
        value = number(row, key)
        if not math.isnan(value):
            print(f"    {label:<36} {value:10.4f}")
        elif key.startswith("charts/"):  # success and return exist once an episode has ended
            print(f"    {label:<36}  none yet: no episode ended in this update's rollout")
    show_success_by_update(rows)
    show_before_after(run_dir, prompt, actions, before, value_before)
    subprocess.call(
        [sys.executable, str(ROOT / "scripts" / "plot_learning_curve.py"), str(run_dir)],
        cwd=ROOT,
    )
    print(f"[demo] run folder: {run_dir} (config.yaml, metrics.csv, tensorboard/, checkpoints/)")
    print(FULL_RUN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
