"""Aggregate post-training test results (runs x seeds) into the paper-style table.

    # any machine (reads results.json files only)
    python scripts/test_results.py 'inputs=[runs/glam_paper]' output_dir=runs/glam_paper/summary
    python scripts/test_results.py 'inputs=[runs/eval/bot-*,runs/eval/random-*]'

Per agent label (the seeds of one run share it) and suite: mean success over the results.json
files, its standard deviation, and the change against `no_change` in %. A suite that was not
applicable to the agent (status "not applicable" in results.json) is left out of the table,
the means and the chart, and listed with its reason under the table. Writes summary.md,
summary.csv and summary.png to `output_dir`; a folder that already holds a summary is refused
unless `overwrite=true`, one that is a file, cannot be written or holds another kind of output
always. Options: configs/eval/test_results.yaml. Exit status: 0 done, 1 bad config, 2 bad input
(nothing to aggregate, a file that is not a results.json, a `baseline` no input played, an
`output_dir` it may not write).
"""

from __future__ import annotations

from glam.cli import exit_on
from glam.config import config_main, register_configs
from glam.eval.config import ResultsTableConfig
from glam.eval.report import (
    aggregate,
    check_baseline,
    excluded_suites,
    find_results,
    read_results,
    write_aggregate,
)
from glam.outputs import SUMMARY, check_output_dir

register_configs()


@config_main(ResultsTableConfig, config_path="../configs/eval", config_name="test_results")
def main(config: ResultsTableConfig) -> None:
    # ValueError: a folder it may not write (OutputDirError), a file that is not a results.json,
    # a baseline no input played; FileNotFoundError: an input that matches nothing.
    with exit_on(ValueError, FileNotFoundError):
        output_dir = check_output_dir(
            config.output_dir,
            SUMMARY,
            key="output_dir",
            overwrite=config.overwrite,
            overwrite_key="overwrite",
        )
        files = find_results(config.inputs)
        results = [read_results(path) for path in files]
        check_baseline(results, config.baseline)
    rows = aggregate(results, baseline=config.baseline)
    paths = write_aggregate(
        output_dir,
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
