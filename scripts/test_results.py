"""Aggregate post-training test results (runs x seeds) into the paper-style table.

    # any machine (reads results.json files only)
    python scripts/test_results.py 'inputs=[runs/glam_paper]' output_dir=runs/glam_paper/summary
    python scripts/test_results.py 'inputs=[runs/eval/bot-*,runs/eval/random-*]'

Per agent label (the seeds of one run share it) and suite: mean success over the results.json
files, its standard deviation, and the change against `no_change` in %. Writes summary.md,
summary.csv and summary.png to `output_dir`. Options: configs/eval/test_results.yaml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from glam.eval.config import ResultsTableConfig, register_configs
from glam.eval.report import aggregate, find_results, write_aggregate

register_configs()


@hydra.main(config_path="../configs/eval", config_name="test_results", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        config: ResultsTableConfig = OmegaConf.to_object(cfg)
        files = find_results(config.inputs)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    rows = aggregate([json.loads(path.read_text()) for path in files], baseline=config.baseline)
    paths = write_aggregate(
        Path(config.output_dir), rows, baseline=config.baseline, title=config.title
    )
    print(paths["md"].read_text())
    print(f"aggregated {len(files)} results.json")
    for kind, path in paths.items():
        print(f"wrote {kind:3s} {path}")


if __name__ == "__main__":
    main()
