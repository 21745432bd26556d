"""Project FLOPs, memory and wall time of a PPO run on given hardware (no model is loaded).

    # one CPU, the embedded model with LoRA: give the peak as cores x GHz x FLOPs per cycle
    # (example figures: read your CPU's own), or as --peak-tflops
    python scripts/estimate_throughput.py --model smollm2-135m --hardware cpu \
        --cpu-cores 2 --cpu-ghz 2.8 --cpu-flops-per-cycle 64 --envs 8 --frames-per-env 32 \
        --epochs 2 --prompt-tokens 60 --candidates 3 --mfu 0.05
    # one GPU, bf16 autocast, Llama-3.2-1B-like shape with LoRA
    python scripts/estimate_throughput.py --model llama-1b-like --hardware a100 \
        --precision amp-bf16 --mfu 0.2 0.4
    # the training presets' LoRA: the top 4 layers only, the update run from the trunk's cache
    python scripts/estimate_throughput.py --model smollm2-135m --hardware h100 \
        --precision amp-bf16 --lora-layers 4 --mfu 0.2
    # several GPUs: the GLAM paper's run (Flan-T5-large fully fine-tuned) on 8 A100s
    python scripts/estimate_throughput.py --model flan-t5-large --full --hardware a100 \
        --devices 8 --mfu 0.1 0.3 --out runs/estimate_paper.json
    # calibrate the MFU from a measured run (bench_ppo.py's seconds per update), then project
    python scripts/estimate_throughput.py --model flan-t5-large --full --hardware a100 \
        --devices 8 --calibrate-seconds-per-update 120 --calibrate-peak-tflops 19.5 \
        --calibrate-envs 4

Everything is arithmetic on the model's shape (`glam.scaling`; docs/scaling.md says what is
counted and what is not). Defaults are the GLAM paper's workload (240-token prompts, 6 actions
of 2 tokens, 32 envs x 40 frames, 4 epochs, minibatch 64, micro-batch 8) with LoRA r=8 on q and v
of every layer in fp32 (the training presets adapt the top 4 layers: `--lora-layers 4`). The
trunk's cache follows `ppo.cache_trunk`'s default, on wherever it applies (`--no-cache-trunk`
turns it off); the table says what was assumed. Without `--mfu` or a calibration, the projection
is shown at a few MFUs.
"""

from __future__ import annotations

import sys

from glam.scaling_report import main

if __name__ == "__main__":
    sys.exit(main())
