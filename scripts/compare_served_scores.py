"""Compare a served model's action scores with the in-process scorer's on the same GLAM prompts.

    # any machine: llama-cpp-python's server of the embedded model's GGUF file (one thread)
    pip install "llama-cpp-python[server]==0.3.36"      # builds llama.cpp: about 30 min here
    python -m llama_cpp.server --model "$(python scripts/compare_served_scores.py --gguf-path)" \
        --port 8093 --n_threads 1 --n_ctx 512 --model_alias smollm2 &
    python scripts/compare_served_scores.py --base-url http://127.0.0.1:8093/v1 \
        --out runs/served_scores/llama_cpp.json
    # our own server of the same model (scripts/serve_openai.py), for reference
    python scripts/compare_served_scores.py --base-url http://127.0.0.1:8000/v1

`--n_ctx 512` holds every prompt here: llama-cpp-python computes a log-softmax over its whole
n_ctx x vocabulary buffer for each answer with log-probabilities (about 10 s a request at 2048
on this CPU under load, 0.3 s at 512).

`--prompts` GLAM prompts (3 observations, the 6 default actions) from random-action episodes of
`--level`, as `scripts/bench_scoring.py` draws them, are scored against the 6 action words by
`glam.teach.scorers.LocalScorer` (the model in this process, fp32) and by
`glam.teach.scorers.OpenAIScorer` at `--base-url` (the dialect found at the first call, or
`--dialect`). Printed and written as JSON: the dialect and why the others were refused, the
largest and mean |served - in-process| score, on how many prompts both pick the same best
action, and the seconds each took. Exit status: 0 done; 2 the server cannot score (its message).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scoring import rollout_prompts  # noqa: E402

import glam  # noqa: E402
from glam.cli import exit_on, fail  # noqa: E402
from glam.llm.chat import ChatClientError  # noqa: E402
from glam.models.specs import EMBEDDED_MODELS  # noqa: E402
from glam.outputs import (  # noqa: E402
    OutputDirError,
    add_output_file_options,
    check_output_file,
    write_json,
)
from glam.teach.scorers import SCORING_DIALECTS, LocalScorer, OpenAIScorer  # noqa: E402
from glam.threads import set_torch_threads

WRITER = "scripts/compare_served_scores.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="the server, up to and including /v1")
    parser.add_argument(
        "--gguf-path", action="store_true", help="print the embedded model's GGUF file and exit"
    )
    parser.add_argument(
        "--summary-of", type=Path, default=None, help="print the summary of a saved --out file"
    )
    parser.add_argument("--model-id", default="", help="model name sent; empty: the first listed")
    parser.add_argument("--model", default=glam.DEFAULT_MODEL, help="the in-process model")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--level", default="BabyAI-MixedTrainLocal-v0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: the cores free)"
    )
    parser.add_argument("--dialect", choices=SCORING_DIALECTS, default=None)
    parser.add_argument("--timeout", type=float, default=120.0)
    add_output_file_options(parser)
    return parser.parse_args(argv)


def summarize(served: list[list[float]], local: list[list[float]]) -> dict:
    """The figures of the comparison: |served - in-process| (largest, mean, median, 90th
    percentile), the mean signed difference, the largest difference of a policy probability
    (softmax over the actions), and the prompts whose best action is the same."""
    a, b = torch.tensor(served), torch.tensor(local)
    gaps = (a - b).abs().flatten()
    quantiles = torch.quantile(gaps, torch.tensor([0.5, 0.9])).tolist()
    return {
        "max_abs_difference": float(gaps.max()),
        "mean_abs_difference": float(gaps.mean()),
        "median_abs_difference": quantiles[0],
        "p90_abs_difference": quantiles[1],
        "mean_signed_difference": float((a - b).mean()),
        "max_policy_probability_difference": float((a.softmax(-1) - b.softmax(-1)).abs().max()),
        "same_best_action": int((a.argmax(-1) == b.argmax(-1)).sum()),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.out is not None:  # before any work
        with exit_on(OutputDirError):
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
    if args.gguf_path:
        entry = EMBEDDED_MODELS[args.model]
        spec = importlib.util.find_spec(entry.package)  # not imported: its CLI is not shipped
        if spec is None or spec.origin is None:
            fail(f"the package {entry.package!r} of {args.model!r} is not installed")
        print(Path(spec.origin).parent / entry.gguf_file)
        return {}
    if args.summary_of is not None:
        results = json.loads(args.summary_of.read_text())
        results |= summarize(results["scores"]["served"], results["scores"]["in_process"])
        print(json.dumps({k: v for k, v in results.items() if k != "scores"}, indent=2))
        return results
    if not args.base_url:
        fail("--base-url is required (the server, up to and including /v1)")
    print(f"[compare] {set_torch_threads(args.threads, '--threads').describe()}", flush=True)
    prompts, actions = rollout_prompts(args.level, args.prompts, 3, args.seed)
    candidates = [actions] * len(prompts)
    start = time.perf_counter()
    local = LocalScorer.load(args.model, device="cpu").log_likelihoods(prompts, candidates)
    local_seconds = time.perf_counter() - start
    try:
        served_scorer = OpenAIScorer(
            args.base_url, args.model_id, timeout=args.timeout, max_retries=1, dialect=args.dialect
        )
        start = time.perf_counter()
        served = served_scorer.log_likelihoods(prompts, candidates)
        served_seconds = time.perf_counter() - start
    except ChatClientError as error:
        fail(error)
    results = {
        "base_url": args.base_url,
        "model_id": served_scorer.endpoint.model_id,
        "in_process_model": args.model,
        "dialect": served_scorer.dialect,
        "refused": served_scorer.refused,
        "batched": served_scorer.batched,
        "prompts": len(prompts),
        "actions": actions,
        **summarize([s.tolist() for s in served], [s.tolist() for s in local]),
        "served_seconds": round(served_seconds, 1),
        "in_process_seconds": round(local_seconds, 1),
        "load_average": list(os.getloadavg()),
        "scores": {
            "served": [s.tolist() for s in served],
            "in_process": [s.tolist() for s in local],
        },
    }
    served_scorer.close()
    summary = {k: v for k, v in results.items() if k != "scores"}
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        write_json(args.out, results, WRITER)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
