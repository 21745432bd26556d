"""The GPU subset: what only a CUDA GPU can check, run with `GLAM_TEST_DEVICE=cuda`.

    GLAM_TEST_DEVICE=cuda python -m pytest tests -q -rs     # the subset alone (tests/conftest.py)

Skipped elsewhere, saying why. scripts/gpu_check.sh runs it on a lent GPU (docs/gpu.md):

- scoring on CUDA gives the CPU's scores: within `FP32_NATS` in fp32 (TF32 off), within
  `BF16_NATS` under bf16 autocast (the trainer's path on the GPU), for a causal and an
  encoder-decoder model;
- the LoRA gradients through the packed scorer are the CPU's (`GRAD_RELATIVE` in fp32);
- the training loop reads the GPU's values once per forward and twice per micro-batch;
- the tiny preset trains on the GPU, checkpoints (the RNG of its own GPU) and resumes;
- one DeepSpeed ZeRO-2 process updates on the GPU and resumes with its optimizer shards;
- written answers sampled on CUDA over turns that reuse the cached keys have the log-probabilities
  of a teacher-forced forward (the path of written actions and of BALROG's evaluation).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_language_agent.py"
FP32_NATS = 1e-3
"""Largest |score on CUDA - score on the CPU| in fp32, in nats: both sum fp32 log-probs, in
another order and with other kernels (the tiny models' scores are a few nats)."""
BF16_NATS = 0.1
"""The same under bf16 autocast against the CPU's fp32: bf16 keeps 8 bits of mantissa. On this
project's CPU (AVX512-BF16), bf16 autocast moved these prompts' scores by at most 0.026 nats
(tiny Llama) and 0.014 (tiny T5), scores of -12 to -9 nats (2026-11-26); a wrong mask or a lost
position moves them by nats."""
GRAD_RELATIVE = 1e-3
"""Largest ||grad on CUDA - grad on the CPU|| / ||grad on the CPU|| of the LoRA weights, fp32."""


@pytest.fixture(autouse=True)
def exact_fp32() -> None:
    """fp32 products in fp32 for the comparisons (evaluation turns TF32 on for speed)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _prompts(count: int) -> tuple[list[str], list[list[str]]]:
    """GLAM prompts of the tiny preset's level a few random steps in, with its candidates (two
    lists cut short: the padding of ragged lists is -inf on every device)."""
    from glam.envs import EnvRunner
    from glam.run_config import compose_run

    cfg = compose_run("tiny", [f"env.num_envs={count}", "env.nbr_obs=3"])
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=count, seed=4321)
    runner.reset()
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        actions = torch.randint(0, len(runner.action_words), (count,), generator=generator)
        runner.step(actions.tolist())
    observations = runner.observations()
    runner.close()
    candidates = [list(c) for c in observations.candidates]
    candidates[1], candidates[3] = candidates[1][:2], candidates[3][:1]
    return list(observations.prompts), candidates


@pytest.mark.parametrize("model_name", ["tiny-random-llama", "tiny-random-t5"])
def test_scores_on_cuda_are_the_cpus(model_name: str) -> None:
    from glam.models.loading import load_model
    from glam.scoring import score_candidates

    prompts, candidates = _prompts(8)
    model, tokenizer = load_model(model_name)
    with torch.no_grad():
        on_cpu = score_candidates(model, tokenizer, prompts, candidates)
        model.cuda()
        in_fp32 = score_candidates(model, tokenizer, prompts, candidates)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            in_bf16 = score_candidates(model, tokenizer, prompts, candidates)
    for scored, tolerance in ((in_fp32, FP32_NATS), (in_bf16, BF16_NATS)):
        assert scored.scores.device.type == "cuda"
        got, expected = scored.scores.float().cpu(), on_cpu.scores
        assert torch.equal(torch.isneginf(got), torch.isneginf(expected))  # absent: -inf
        present = torch.isfinite(expected)
        assert torch.isfinite(got[present]).all()
        assert (got[present] - expected[present]).abs().max().item() <= tolerance


def test_lora_gradients_on_cuda_are_the_cpus() -> None:
    from glam.config import AdapterConfig
    from glam.models.loading import load_model
    from glam.policy.adapters import apply_lora
    from glam.scoring import score_candidates

    prompts, candidates = _prompts(4)

    def gradients(device: str) -> torch.Tensor:
        base, tokenizer = load_model("tiny-random-llama")
        torch.manual_seed(0)  # the same A matrices on both devices
        model = apply_lora(base, AdapterConfig())
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():  # B starts at zero: give it values so that A gets gradients
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
        model.to(device)
        scored = score_candidates(model, tokenizer, prompts, candidates)
        loss = scored.scores[scored.mask].float().sum() + scored.prompt_hidden.square().mean()
        loss.backward()
        trainable = [p for p in model.parameters() if p.requires_grad]
        return torch.cat([p.grad.float().flatten().cpu() for p in trainable])

    on_cpu, on_cuda = gradients("cpu"), gradients("cuda")
    assert on_cpu.abs().sum() > 0
    assert ((on_cuda - on_cpu).norm() / on_cpu.norm()).item() <= GRAD_RELATIVE


def test_the_loop_waits_for_the_gpu_once_per_forward_and_twice_per_micro_batch(
    tmp_path: Path,
) -> None:
    from accelerate import Accelerator
    from helpers_syncs import rollout_and_update_reads

    reads = rollout_and_update_reads(
        tmp_path, Accelerator(), ["ppo.micro_batch_size=8", "train.total_frames=64"]
    )
    loop = (
        "glam/ppo/trainer.py",
        "glam/ppo/update.py",
        "glam/ppo/learner.py",
        "glam/ppo/algorithms.py",
        "glam/policy/output.py",
    )
    print("GPU reads, rollout:", dict(reads["rollout"].by_file), "forwards:", reads["forwards"])
    print("GPU reads, update:", dict(reads["update"].by_file), "micro:", reads["micro_batches"])
    # The loop's own reads. Rollout: the finiteness flag, and the values and the actions the
    # CPU needs (the buffer, the envs). Update: two flags per micro-batch, the gradient norm per
    # optimizer step, and a few per update (the advantages' statistics, the metrics).
    assert reads["rollout"].count(*loop) <= 3 * reads["forwards"]
    bound = 2 * reads["micro_batches"] + reads["optimizer_steps"] + 8
    assert reads["update"].count(*loop) <= bound


def _env() -> dict[str, str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _train(launcher: list[str], run_dir: Path, frames: int, *overrides: str) -> str:
    command = [
        *launcher,
        str(SCRIPT),
        "--config-name",
        "tiny",
        f"train.output_dir={run_dir}",
        f"train.total_frames={frames}",
        "train.save_every=1",
        *overrides,
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _launch(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["launch"]


def _updates(run_dir: Path) -> list[int]:
    return [int(row.split(",")[0]) for row in (run_dir / "metrics.csv").read_text().split()[1:]]


def test_the_tiny_preset_trains_on_cuda_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # model.autocast_bf16=null: the trainer picks bf16 autocast on a GPU that computes it.
    auto = "model.autocast_bf16=null"
    first = _train([sys.executable], run_dir, 128, auto)
    major = torch.cuda.get_device_capability()[0]
    assert ("precision: bf16 autocast" in first) == (major >= 8), first
    assert _launch(run_dir)["device"] == "cuda"
    rng = torch.load(run_dir / "checkpoints" / "update_000002" / "rank_0" / "rng.pt")
    assert isinstance(rng["cuda"], torch.Tensor)  # its own GPU's generator, not every GPU's
    resumed = _train([sys.executable], run_dir, 192, auto, "train.resume=true")
    assert "resumed from" in resumed and "update_000002" in resumed
    assert _updates(run_dir) == [1, 2, 3]


def test_one_zero2_process_updates_on_cuda_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed)")
    config = ROOT / "configs" / "accelerate" / "zero2.yaml"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    launcher += ["--num_processes", "1"]
    run_dir = tmp_path / "zero2"
    _train(launcher, run_dir, 64)
    launch = _launch(run_dir)
    assert (launch["distributed_type"], launch["deepspeed_stage"]) == ("DEEPSPEED", 2)
    assert launch["device"] == "cuda"
    assert (run_dir / "checkpoints" / "update_000001" / "deepspeed" / "state").is_dir()
    resumed = _train(launcher, run_dir, 128, "train.resume=true")
    assert "resumed from" in resumed
    assert _updates(run_dir) == [1, 2]


def test_written_answers_on_cuda_keep_their_log_probs_across_cached_turns() -> None:
    """Three turns of a dialogue that only grows, on CUDA, each turn reading the earlier turns'
    keys from the cache: every sampled token's log-probability is the one a teacher-forced
    forward of the whole prompt gives it (fp32, TF32 off). The first GPU check found this path
    broken under transformers 5.17 (the cache's keyword), with the rest of this subset passing."""
    from glam.decoding import TurnCache, sample_answers, score_answers
    from glam.models.loading import load_model

    model, tokenizer = load_model("tiny-random-llama")
    model.to("cuda").eval()
    stop = torch.zeros(len(tokenizer), dtype=torch.bool)
    stop[tokenizer.eos_token_id] = True
    prompts = [torch.tensor(tokenizer(text)["input_ids"]) for text in _prompts(4)[0]]
    more = torch.tensor(
        tokenizer(" You see a wall. Action:", add_special_tokens=False)["input_ids"]
    )
    cache = TurnCache()
    for turn in range(3):
        torch.manual_seed(turn)
        sampled = sample_answers(
            model, prompts, max_new_tokens=5, temperature=1.0, stop=stop, pad_id=0, cache=cache
        )
        if turn:
            assert (sampled.reused > 0).all()  # the earlier turns' keys were read
        logprobs, _, _ = score_answers(
            model, prompts, sampled.tokens, sampled.lengths, temperature=1.0, pad_id=0
        )
        torch.testing.assert_close(logprobs.cpu(), sampled.logprobs, rtol=1e-4, atol=1e-4)
        prompts = [
            torch.cat([ids, sampled.tokens[i, : sampled.lengths[i]], more])
            for i, ids in enumerate(prompts)
        ]
