"""Compare cloned policies on the same held-out decisions: accuracy, and McNemar's exact test
against the first, Holm-corrected over the comparisons.

    python scripts/compare_clones.py runs/clone/a runs/clone/b runs/clone/c

Each folder is a `scripts/clone_policy.py` output. Clones of one dataset split with one seed
hold out the same decisions; `clone.json` records the demonstrated actions and each policy's
choices on them. For a folder written before it did, the choices are computed again from its
`policy/` (the whole model, on the dataset `clone.json` names). Exit status: 0 done; 2 bad input
(not a cloned policy, or clones of different held-out decisions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glam.cli import report
from glam.eval.stats import holm, mcnemar_exact_p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("clones", type=Path, nargs="+", help="clone_policy.py output folders")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: the cores free)"
    )
    args = parser.parse_args(argv)
    records = {}
    for folder in args.clones:
        try:
            records[folder] = json.loads((folder / "clone.json").read_text())
        except (OSError, ValueError) as error:
            return report(f"{folder}: not a finished clone_policy.py output ({error})")
    for folder, record in records.items():
        if "final_choices" not in record:
            record.update(_recompute(folder, record, args.threads))
    targets = {tuple(r["held_out_targets"]) for r in records.values()}
    if len(targets) != 1:
        return report("the clones were measured on different held-out decisions")
    target = list(targets.pop())
    correct = {
        folder: [c == t for c, t in zip(r["final_choices"], target, strict=True)]
        for folder, r in records.items()
    }
    reference = args.clones[0]
    raw = {}
    for folder in args.clones[1:]:
        only_a = sum(a and not b for a, b in zip(correct[folder], correct[reference], strict=True))
        only_b = sum(b and not a for a, b in zip(correct[folder], correct[reference], strict=True))
        raw[folder] = (mcnemar_exact_p(only_a, only_b), only_a, only_b)
    adjusted = dict(zip(raw, holm([p for p, _, _ in raw.values()]), strict=True))
    print(f"{len(target)} held-out decisions; McNemar's exact test against {reference}, Holm")
    print(f"{'clone':<48} {'accuracy':>8} {'only it':>8} {'only ref':>8} {'p':>9} {'p Holm':>9}")
    for folder in args.clones:
        accuracy = sum(correct[folder]) / len(target)
        if folder in raw:
            p, only_a, only_b = raw[folder]
            tail = f"{only_a:8d} {only_b:8d} {p:9.3g} {adjusted[folder]:9.3g}"
        else:
            tail = f"{'-':>8} {'-':>8} {'-':>9} {'-':>9}"
        print(f"{str(folder):<48} {accuracy:8.3f} {tail}")
    return 0


def _recompute(folder: Path, record: dict, threads: int | None) -> dict:
    """The held-out decisions' targets and the saved policy's choices, as clone_policy.py
    measures them (its split, its first `clone.max_eval_pairs` held-out decisions)."""
    from omegaconf import OmegaConf

    from glam.bc.choice import DecisionSet, measure, split_decisions
    from glam.bc.config import CloneConfig
    from glam.demos import load_demos
    from glam.policy.llm_policy import LLMActorCritic
    from glam.threads import set_torch_threads

    print(f"[compare] {set_torch_threads(threads, '--threads').describe()}", flush=True)
    saved = OmegaConf.load(folder / "config.yaml").clone
    clone = CloneConfig(**OmegaConf.to_container(saved))
    _, held_out = split_decisions(load_demos(record["dataset"]), clone)
    policy = LLMActorCritic.from_pretrained(folder / "policy")
    decisions = DecisionSet.from_pairs(held_out, tuple(policy.action_words))
    found = measure(policy, decisions, clone.batch_size)
    print(f"[compare] {folder}: choices computed again (accuracy {found['accuracy']:.3f})")
    return {"held_out_targets": decisions.targets.tolist(), "final_choices": found["choices"]}


if __name__ == "__main__":
    sys.exit(main())
