"""The one output-folder check of every script (`glam.outputs`) and the one error format
(`glam.cli`), on hand-made folders: no model, no env.

    .venv/bin/python -m pytest tests/test_outputs.py
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from glam import outputs
from glam.cli import error_message, exit_on, fail, report
from glam.outputs import (
    BC_POLICY,
    DEMOS,
    EVALUATION,
    KINDS,
    PLOT_SUFFIXES,
    TRAINING_RUN,
    OutputDirError,
    OutputExistsError,
    OutputKind,
    check_output_dir,
    check_output_file,
)


def _holding(folder: Path, kind: OutputKind) -> Path:
    """`folder` holding what marks `kind` (files; `checkpoints` as a folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in kind.marks:
        target = folder / name.replace("*", "00000")
        if name == "checkpoints":
            (target / "update_000001").mkdir(parents=True)
        else:
            target.write_text("{}")
    return folder


def _check(folder: Path, kind: OutputKind, overwrite: bool) -> Path:
    return check_output_dir(
        folder, kind, key="out", overwrite=overwrite, overwrite_key="out_overwrite"
    )


@pytest.mark.parametrize("held", list(KINDS), ids=str)
@pytest.mark.parametrize("writer", list(KINDS), ids=str)
def test_no_writer_writes_into_another_kind_of_output_even_when_told_to_overwrite(
    tmp_path: Path, held: str, writer: str
) -> None:
    """A demonstrations collector with overwrite on once deleted a training run, checkpoints and
    all; a BC run with overwrite on replaced a run's config.yaml."""
    folder = _holding(tmp_path / "out", KINDS[held])
    before = sorted(path.name for path in folder.iterdir())
    if held == writer:
        with pytest.raises(OutputExistsError, match=r"already holds .*: pass out_overwrite=true"):
            _check(folder, KINDS[writer], overwrite=False)
        assert _check(folder, KINDS[writer], overwrite=True) == folder
    else:
        with pytest.raises(OutputDirError, match=f"holds {held} .*never replaces: choose another"):
            _check(folder, KINDS[writer], overwrite=True)
    assert sorted(path.name for path in folder.iterdir()) == before


def test_a_file_a_file_above_and_an_unwritable_folder_are_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("x")
    with pytest.raises(OutputDirError, match=r"out='.*notes.txt' is a file, not a folder"):
        _check(file, EVALUATION, overwrite=True)
    with pytest.raises(OutputDirError, match=r"cannot be created: .*notes.txt is a file"):
        _check(file / "eval", EVALUATION, overwrite=True)

    def read_only(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(outputs.tempfile, "NamedTemporaryFile", read_only)
    with pytest.raises(OutputDirError, match=r"is not writable \(permission denied in "):
        _check(tmp_path / "new" / "eval", EVALUATION, overwrite=False)
    assert not (tmp_path / "new").exists()  # nothing is created by the check


def test_a_folder_is_checked_and_left_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    assert _check(folder, EVALUATION, overwrite=False) == folder
    assert list(tmp_path.iterdir()) == []  # no folder, no write-test file left behind
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    assert _check(tmp_path / "c", EVALUATION, overwrite=False) == tmp_path / "c"
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("kind", [DEMOS, BC_POLICY], ids=["demos", "bc"])
def test_a_dataset_or_a_policy_goes_only_into_a_new_empty_or_own_folder(
    tmp_path: Path, kind: OutputKind
) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    assert _check(folder, kind, overwrite=False) == folder  # empty
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match=r"is not empty \(notes.txt\) and holds no "):
        _check(folder, kind, overwrite=True)


def test_replacing_a_dataset_never_deletes_other_files_with_it(tmp_path: Path) -> None:
    folder = _holding(tmp_path / "demos", DEMOS)
    (folder / "data-00000-of-00001.arrow").write_bytes(b"x")
    assert _check(folder, DEMOS, overwrite=True) == folder
    (folder / "README.md").write_text("my notes")
    with pytest.raises(OutputDirError, match=r"holds other files too \(README.md\), which"):
        _check(folder, DEMOS, overwrite=True)


def test_the_trainer_s_message_for_a_used_run_folder(tmp_path: Path) -> None:
    folder = _holding(tmp_path / "run", TRAINING_RUN)
    (folder / "config.yaml").write_text("a: 1\n")
    with pytest.raises(OutputExistsError) as refused:
        check_output_dir(
            folder,
            TRAINING_RUN,
            key="train.output_dir",
            overwrite=False,
            overwrite_key="train.resume",
            again="continue it",
        )
    assert str(refused.value) == (
        f"train.output_dir='{folder}' already holds a run (config.yaml, metrics.csv, "
        "checkpoints): pass train.resume=true to continue it, or choose another train.output_dir"
    )


def test_a_flag_is_named_as_a_flag_and_an_output_file_must_not_be_a_folder(
    tmp_path: Path,
) -> None:
    folder = _holding(tmp_path / "cmp", KINDS["a comparison of runs"])
    with pytest.raises(OutputExistsError, match="pass --overwrite to replace them"):
        check_output_dir(
            folder,
            KINDS["a comparison of runs"],
            key="--out",
            overwrite=False,
            overwrite_key="--overwrite",
        )
    with pytest.raises(OutputDirError, match=r"--out='.*cmp' is a folder: name a file"):
        check_output_file(folder, key="--out", writer="scripts/x.py")
    new = check_output_file(tmp_path / "plots" / "curve.png", key="--out", writer="scripts/x.py")
    assert new.name == "curve.png" and not (tmp_path / "plots").exists()


def test_every_script_error_has_one_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert report("bad input") == 2
    assert report(KeyError("'ppo.lrr' is not a key"), status=1) == 1
    with pytest.raises(SystemExit) as stopped, exit_on(ValueError):
        raise ValueError("a line\nand its detail")
    assert stopped.value.code == 2
    with pytest.raises(SystemExit) as stopped:
        fail(FileNotFoundError(errno.ENOENT, "No such file or directory", "runs/x"), status=3)
    assert stopped.value.code == 3
    assert capsys.readouterr().err.splitlines() == [
        "error: bad input",
        "error: 'ppo.lrr' is not a key",
        "error: a line",
        "and its detail",
        "error: runs/x: no such file or directory",
    ]
    assert error_message(RuntimeError()) == "RuntimeError"
    with pytest.raises(TypeError), exit_on(ValueError):  # other errors are bugs: a traceback
        raise TypeError("a bug")


# --------------------------------------------------------------------------------------------
# Output files: replaced only by their own writer, never an output folder's file
# --------------------------------------------------------------------------------------------


def test_a_file_is_replaced_only_by_the_script_that_wrote_it(tmp_path: Path) -> None:
    report_json = tmp_path / "bench.json"
    outputs.write_json(report_json, {"seconds": 1.5}, "scripts/bench_a.py")
    assert json.loads(report_json.read_text()) == {
        "written_by": "scripts/bench_a.py",
        "seconds": 1.5,
    }
    assert outputs.written_by(report_json) == "scripts/bench_a.py"
    assert check_output_file(report_json, key="--out", writer="scripts/bench_a.py") == report_json
    with pytest.raises(OutputDirError, match=r"exists \(scripts/bench_a.py wrote it\): pass "):
        check_output_file(report_json, key="--out", writer="scripts/bench_b.py")
    check_output_file(report_json, key="--out", writer="scripts/bench_b.py", overwrite=True)

    notes = tmp_path / "notes.json"
    notes.write_text('["a list, not a report"]')
    with pytest.raises(OutputDirError, match="not written by this script.*--overwrite"):
        check_output_file(notes, key="--json", writer="scripts/bench_a.py")
    assert outputs.written_by(notes) is None
    (tmp_path / "broken.json").write_bytes(b"\xff{")
    assert outputs.written_by(tmp_path / "broken.json") is None
    assert not list(tmp_path.glob(".*partial"))  # the temporary file was renamed over


@pytest.mark.parametrize("name", sorted(KINDS))
def test_an_output_folders_own_file_is_never_replaced(tmp_path: Path, name: str) -> None:
    kind = KINDS[name]
    folder = _holding(tmp_path / "out", kind)
    for own in kind.files:
        if "*" in own or (folder / own).is_dir():
            continue
        with pytest.raises(OutputDirError, match=f"is a file of {name}"):
            check_output_file(folder / own, key="--out", writer="scripts/x.py", overwrite=True)
    # Its other files are the writer's to choose: a plot beside a run's metrics.
    check_output_file(folder / "curve.png", key="--out", writer="scripts/x.py")


def test_a_plot_is_marked_and_named_by_a_format_matplotlib_writes(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure = plt.figure()
    figure.savefig(tmp_path / "curve.png", metadata=outputs.png_metadata("scripts/plot.py"))
    plt.close(figure)
    assert outputs.written_by(tmp_path / "curve.png") == "scripts/plot.py"
    check_output_file(
        tmp_path / "curve.png", key="--out", writer="scripts/plot.py", suffixes=PLOT_SUFFIXES
    )
    with pytest.raises(OutputDirError, match=r"\(scripts/plot.py wrote it\)"):
        check_output_file(tmp_path / "curve.png", key="--out", writer="scripts/other.py")
    for bad in ("curve", "curve.jpeg2000"):
        with pytest.raises(OutputDirError, match=r"name a file ending in \.png or \.pdf or"):
            check_output_file(
                tmp_path / bad, key="--out", writer="scripts/plot.py", suffixes=PLOT_SUFFIXES
            )
