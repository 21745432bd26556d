"""Aggregate post-training test results (runs x seeds) into the paper-style table.

    # any machine (reads results.json files only)
    python scripts/test_results.py 'inputs=[runs/glam_paper]' output_dir=runs/glam_paper/summary
    python scripts/test_results.py 'inputs=[runs/eval/bot-*,runs/eval/random-*]'

Per agent label (the seeds of one run share it) and suite: mean success over the results.json
files, its standard deviation, and the change against `no_change` in %. A suite that was not
applicable to the agent (status "not applicable" in results.json) is left out of the table,
the means and the chart, and listed with its reason under the table. Writes summary.md,
summary.csv and summary.png to `output_dir`; a folder that already holds a summary is refused
unless `overwrite=true`. Options: configs/eval/test_results.yaml. Exit status: 0 done, 1 bad
config, 2 nothing to aggregate or `output_dir` holding a summary.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from glam.config import config_main, refuse_used_output_dir, register_configs
from glam.eval.config import ResultsTableConfig
from glam.eval.report import (
    SUMMARY_FILES,
    aggregate,
    excluded_suites,
    find_results,
    write_aggregate,
)

register_configs()


@config_main(ResultsTableConfig, config_path="../configs/eval", config_name="test_results")
def main(config: ResultsTableConfig) -> None:
    try:
        if not config.overwrite:
            refuse_used_output_dir(
                config.output_dir, SUMMARY_FILES, key="output_dir", overwrite_key="overwrite"
            )
        files = find_results(config.inputs)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    results = [json.loads(path.read_text()) for path in files]
    rows = aggregate(results, baseline=config.baseline)
    paths = write_aggregate(
        Path(config.output_dir),
        rows,
        baseline=config.baseline,
        title=config.title,
        excluded=excluded_suites(results),
    )
    print(paths["md"].read_text())
    print(f"aggregated {len(files)} results.json")
    for kind, path in paths.items():
        print(f"wrote {kind:3s} {path}")


if __name__ == "__main__":
    main()
