"""Run a campaign on this machine, without SLURM: its jobs as subprocesses, N at a time.

`run_local` is what `scripts/launch_campaign.py CAMPAIGN --local --jobs N` runs once every job's
config has been composed and checked (`glam.campaign.submission.launch`). Each job runs, from the
repository root, the command line its SLURM batch script would run: `python SCRIPT ARGS` (or
`accelerate launch --num_processes P SCRIPT ARGS` when `local.processes` > 1), training with
`train.resume=true`, its output appended to `OUTPUT_ROOT/CAMPAIGN/local/JOB.log`.

- **Threads**: every process gets `local.torch_threads`, by default the cores this launcher may
  use divided by the jobs running at once times the processes per run (at least 1): the
  `torch_threads` key of the job's script and OMP_NUM_THREADS / MKL_NUM_THREADS say so.
- **GPUs**: where CUDA is, each concurrent job gets its own `local.processes` devices
  (CUDA_VISIBLE_DEVICES); one-process jobs share them when there are more jobs than devices.
- **Skip, resume**: a training job whose newest checkpoint reached `train.total_frames` is skipped;
  one with an older checkpoint resumes from it (the trainer rewinds metrics.csv to it). An
  evaluation whose folder holds every result file is skipped; one stopped before its end (its
  journal, `glam.eval.journal`) continues with `eval.resume=true`, keeping its finished episodes;
  one left half-written otherwise is run again with `eval.overwrite=true`. Evaluations start
  once their training job has finished.
- **State**: `OUTPUT_ROOT/CAMPAIGN/local/jobs.tsv` holds one row per job (status, exit code,
  seconds, pid, progress, log), rewritten at every change; `STATUSES` lists the statuses.
- **Stopping**: SIGINT (Ctrl-C) or SIGTERM of the launcher sends SIGTERM to every running job
  (the trainer saves a checkpoint and exits 0), starts nothing more and exits 128 + the signal
  number, saying what is left; a second signal, a second or more later, kills the jobs at once.
  Running the same command again continues. A lock (`local/launcher.lock`, held by the launcher
  and inherited by its jobs) stops a second launcher from running the campaign's jobs twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glam.campaign.config import REPO_ROOT, CampaignConfig, CampaignError, LocalConfig
from glam.campaign.jobs import Job
from glam.eval.config import RESULT_FILES
from glam.eval.journal import Journal
from glam.runs.folder import CHECKPOINTS_DIR, LATEST_POINTER

__all__ = [
    "ACTIONS",
    "STATUSES",
    "LocalJob",
    "LocalRunner",
    "LocalSettings",
    "assess",
    "describe",
    "device_groups",
    "job_command",
    "job_environment",
    "plan_local",
    "run_local",
    "threads_per_process",
    "training_progress",
]

STATE_FILE = "jobs.tsv"
LOCK_FILE = "launcher.lock"
TRAINER_STATE = "trainer_state.json"
"""What a checkpoint says of a run's progress (`glam.runs.checkpoint`'s file, read without
torch; the folders' names are `glam.runs.folder`'s)."""
STATUSES = {
    "pending": "waiting for a free slot or for its training job",
    "running": "running now (pid in the state file)",
    "done": "finished in this launch, from a fresh start",
    "resumed": "finished in this launch, continued from a checkpoint of an earlier one",
    "skipped": "already finished before this launch: not run",
    "stopped": "stopped by a signal before the end (a training job saved a checkpoint)",
    "failed": "exited with an error or was killed; the next launch runs it again",
    "not run": "an evaluation whose training job did not finish",
}
"""A job's status in the state file and the summary, with its meaning."""
FINISHED = ("done", "resumed", "skipped")
POLL_SECONDS = 0.2
REPEAT_SECONDS = 1.0
"""A second stop signal this long after the first kills the jobs (a Ctrl-C that reaches the
launcher twice within milliseconds is one Ctrl-C)."""


@dataclass
class LocalSettings:
    """How this launch runs its jobs: concurrency, threads and devices."""

    jobs: int
    """Jobs running at once (`--jobs`, at most the number of jobs)."""
    processes: int
    """Training processes per run (`local.processes`)."""
    torch_threads: int
    """torch threads per training process."""
    cores: int
    """Cores this launcher may use."""
    device_groups: list[list[str]]
    """CUDA devices of each slot (empty lists without CUDA)."""


@dataclass
class LocalJob:
    """A campaign job as this launcher runs it, with what happened to it."""

    job: Job
    config: Any
    """The job's composed, validated config (`TrainingRunConfig`, `PostTrainingTestsConfig`)."""
    log_path: Path
    status: str = "pending"
    exit_code: int | None = None
    seconds: float | None = None
    detail: str = ""
    """Progress: frames reached, the checkpoint resumed, why it failed."""
    resumed: bool = False
    process: subprocess.Popen | None = None
    slot: int | None = None
    started: float = 0.0

    @property
    def label(self) -> str:
        return self.job.label

    @property
    def kind(self) -> str:
        return self.job.config.kind


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_process(cores: int, jobs: int, processes: int) -> int:
    """The cores divided by the processes running at once, at least 1."""
    return max(1, cores // (jobs * processes))


def visible_gpus() -> list[str]:
    """CUDA devices this launcher may hand out: CUDA_VISIBLE_DEVICES's, else every device.

    torch (seconds to import) is asked only on Linux where a GPU driver shows its device files
    (NVIDIA's, or ROCm's /dev/kfd): macOS has no CUDA.
    """
    drivers = ("/dev/nvidiactl", "/dev/kfd")
    if sys.platform != "linux" or not any(Path(path).exists() for path in drivers):
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    return [str(index) for index in range(torch.cuda.device_count())]


def device_groups(gpus: Sequence[str], slots: int, processes: int) -> list[list[str]]:
    """The devices of each of `slots` concurrent jobs: `processes` devices each, disjoint when
    there are enough; one-process jobs share them in turn when there are not.

    Raises:
        CampaignError: several processes per run and too few devices for every slot.
    """
    if not gpus:
        return [[] for _ in range(slots)]
    if slots * processes <= len(gpus):
        return [list(gpus[slot * processes : (slot + 1) * processes]) for slot in range(slots)]
    if processes == 1:
        return [[gpus[slot % len(gpus)]] for slot in range(slots)]
    raise CampaignError(
        f"--jobs {slots} x local.processes {processes} needs {slots * processes} GPUs, "
        f"{len(gpus)} visible ({','.join(gpus)}): lower --jobs"
    )


def plan_local(campaign: CampaignConfig, jobs: list[Job], max_jobs: int) -> LocalSettings:
    """Settings of a local launch, and each job's threads added to its overrides (so the checks
    that follow see the command as it will run).

    Raises:
        CampaignError: `--jobs` below 1, a campaign that sets the threads itself, or too few GPUs.
    """
    if max_jobs < 1:
        raise CampaignError(f"--jobs must be >= 1, got {max_jobs}")
    local = campaign.local
    arm_keys = [key for changes in (campaign.arms or {}).values() for key in changes]
    set_by_campaign = [
        key
        for key in [*campaign.overrides, *arm_keys, *(campaign.grid or {})]
        + list(campaign.evaluation.overrides if campaign.evaluation else [])
        if key.lstrip("+~") in ("train.torch_threads", "eval.torch_threads")
    ]
    if set_by_campaign:
        raise CampaignError(
            f"{', '.join(set_by_campaign)}: --local sets the threads of every process; "
            "use local.torch_threads"
        )
    slots = min(max_jobs, len(jobs))
    cores = available_cores()
    threads = local.torch_threads or threads_per_process(cores, slots, local.processes)
    gpus = visible_gpus()
    settings = LocalSettings(
        slots, local.processes, threads, cores, device_groups(gpus, slots, local.processes)
    )
    for job in jobs:
        # An evaluation is one process: it gets the cores of its slot.
        count = threads if job.config.kind == "train" else threads * local.processes
        job.config.overrides.append(f"{job.config.entry.threads_key}={count}")
    return settings


def job_command(
    job: Job, local: LocalConfig, *, cuda: bool, port: int | str | None = None
) -> list[str]:
    """The command line of a job: its SLURM batch script's, with this interpreter.

    `port` is the rendezvous port of a several-process run (`--main_process_port`), so that
    concurrent runs do not collide; `cuda` picks the default accelerate config.
    """
    arguments = [job.config.entry_point, *job.config.arguments()]
    if job.config.kind != "train" or local.processes == 1:
        return [sys.executable, *arguments]
    # The SLURM templates' layout on GPUs; on the CPU, `--cpu --num_processes N` would start
    # one process (configs/accelerate/multi_cpu.yaml says why).
    options = list(local.accelerate_args) or (
        ["--multi_gpu"] if cuda else ["--config_file", "configs/accelerate/multi_cpu.yaml"]
    )
    if port is not None and "--main_process_port" not in options:
        options = ["--main_process_port", str(port), *options]
    launcher = [sys.executable, "-m", "accelerate.commands.launch"]
    return [*launcher, "--num_processes", str(local.processes), *options, *arguments]


def job_environment(local: LocalConfig, threads: int, devices: Sequence[str]) -> dict[str, str]:
    """Variables a job gets on top of the launcher's environment."""
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {
        "PYTHONPATH": python_path,  # the glam of this checkout, whatever is installed
        "PYTHONUNBUFFERED": "1",  # log lines as they come
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        **({"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else {}),
        **local.env,
    }


ACTIONS = {
    "skip": "skip: {}",
    "start": "fresh start: {}",
    "resume": "resume from {}",
    "redo": "evaluate again with eval.overwrite=true: {}",
}
"""What `assess` may decide, as told to people (with its detail)."""


def describe(action: str, detail: str) -> str:
    """An `assess` decision in words: `resume from update_000002 at 128/256 frames`."""
    return ACTIONS[action].format(detail)


def assess(job: LocalJob) -> tuple[str, str]:
    """What to do with a job now: an `ACTIONS` key, and its detail.

    Training: its newest checkpoint against `train.total_frames`. Evaluation: its result files.
    """
    if job.kind == "train":
        return training_progress(Path(job.config.train.output_dir), job.config.train.total_frames)
    output_dir = Path(job.config.eval.output_dir)
    unfinished = Journal.found(output_dir)
    if unfinished is not None:  # stopped before its end (a finished one removes its journal)
        return "resume", f"its journal ({unfinished} episodes finished)"
    present = [name for name in RESULT_FILES if (output_dir / name).exists()]
    if len(present) == len(RESULT_FILES):
        return "skip", f"results in {output_dir}"
    if present:
        missing = ", ".join(name for name in RESULT_FILES if name not in present)
        return "redo", f"results incomplete (no {missing})"
    return "start", "no results yet"


def action_arguments(job: LocalJob, action: str) -> list[str]:
    """What an evaluation's command adds for `assess`'s decision: `eval.overwrite=true` to redo
    it, `eval.resume=true` to continue it (training always runs with `train.resume=true`)."""
    if job.kind == "train":
        return []
    return {"redo": ["eval.overwrite=true"], "resume": ["eval.resume=true"]}.get(action, [])


def training_progress(run_dir: Path, total_frames: int) -> tuple[str, str]:
    """`skip` when the newest checkpoint of `run_dir` reached `total_frames`, `resume` when it
    has an older one (or one the trainer must judge), else `start`.

    Reads the two files of the checkpoint layout (README, "Checkpoints") that say how far a run
    got, `checkpoints/latest` and its `trainer_state.json`, without loading torch: the trainer
    checks the whole checkpoint when it resumes.
    """
    pointer = run_dir / CHECKPOINTS_DIR / LATEST_POINTER
    if not pointer.is_file():
        return "start", "no checkpoint yet"
    try:
        name = pointer.read_text().strip()
        frames = json.loads((pointer.parent / name / TRAINER_STATE).read_text())["frames"]
        if not isinstance(frames, int):
            raise ValueError(f"frames is {frames!r}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        return "resume", f"the newest checkpoint (unreadable here: {error})"
    if frames >= total_frames:
        return "skip", f"{frames}/{total_frames} frames"
    return "resume", f"{name} at {frames}/{total_frames} frames"


class LocalRunner:
    """Runs a campaign's jobs in a pool of subprocesses; `run` returns the exit status."""

    def __init__(
        self,
        campaign: CampaignConfig,
        jobs: list[LocalJob],
        settings: LocalSettings,
        state_dir: Path,
        lock_fd: int | None = None,
    ) -> None:
        """`lock_fd`: the campaign's lock, kept open in every job so that it stays held while
        any job lives."""
        self.campaign = campaign
        self.jobs = jobs
        self.settings = settings
        self.state_path = state_dir / STATE_FILE
        self.by_job = {id(job.job): job for job in jobs}
        self.free_slots = list(range(settings.jobs))
        self.cuda = any(settings.device_groups)
        self.stop_signals: list[tuple[int, float]] = []
        self.forwarded = 0
        """Stop signals already acted on: 1 sent SIGTERM to the jobs, 2 SIGKILL."""
        self.lock_fd = lock_fd

    # ---------------------------------------------------------------------------------------
    # The loop
    # ---------------------------------------------------------------------------------------

    def run(self) -> int:
        """Start jobs as slots free up until all are finished, failed or stopped."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._write_state()
            while True:
                self._reap()
                if self.stop_signals:
                    self._forward_stop()
                else:
                    self._start_ready()
                running = [job for job in self.jobs if job.status == "running"]
                if not running and (self.stop_signals or not self._startable()):
                    break
                time.sleep(POLL_SECONDS)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self._write_state()
        return self._summarize()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signals.append((signum, time.monotonic()))

    def _startable(self) -> bool:
        return any(job.status == "pending" for job in self.jobs)

    def _forward_stop(self) -> None:
        """SIGTERM to the running jobs on the first stop signal; SIGKILL on a later one."""
        running = [job for job in self.jobs if job.status == "running"]
        first_signal, first_time = self.stop_signals[0]
        repeated = any(t - first_time >= REPEAT_SECONDS for _, t in self.stop_signals[1:])
        if self.forwarded == 0:
            self.forwarded = 1
            name = signal.Signals(first_signal).name
            _say(
                f"{name}: stopping {len(running)} running job(s) (SIGTERM: a training saves a "
                "checkpoint and exits); starting nothing more. Again to kill them at once."
            )
            self._signal_jobs(running, signal.SIGTERM)
        elif self.forwarded == 1 and repeated:
            self.forwarded = 2
            _say(
                f"killing {len(running)} running job(s) (SIGKILL): they resume from their last "
                "checkpoint next time"
            )
            self._signal_jobs(running, signal.SIGKILL)

    @staticmethod
    def _signal_jobs(jobs: list[LocalJob], signum: int) -> None:
        for job in jobs:
            # The job's process group: its launcher and the processes that stayed in it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.process.pid, signum)

    def _start_ready(self) -> None:
        """Start pending jobs in campaign order while slots are free; settle those that need no
        slot (skipped, or an evaluation whose training failed)."""
        for job in self.jobs:
            if job.status != "pending":
                continue
            after = self.by_job.get(id(job.job.after)) if job.job.after is not None else None
            if after is not None and after.status not in FINISHED:
                if after.status in ("pending", "running"):
                    continue
                self._settle(job, "not run", None, f"{after.label} {after.status}")
                continue
            action, detail = assess(job)
            if action == "skip":
                self._settle(job, "skipped", None, detail)
                continue
            if not self.free_slots:
                return
            self._start(job, action, detail)

    def _start(self, job: LocalJob, action: str, detail: str) -> None:
        slot = self.free_slots.pop(0)
        devices = self.settings.device_groups[slot]
        port = _free_port() if job.kind == "train" and self.settings.processes > 1 else None
        command = job_command(job.job, self.campaign.local, cuda=self.cuda, port=port)
        command += action_arguments(job, action)
        threads = self.settings.torch_threads
        if job.kind != "train":
            threads *= self.settings.processes
        environment = job_environment(self.campaign.local, threads, devices)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        with job.log_path.open("a") as log:
            log.write(
                f"[glam] {time.strftime('%Y-%m-%d %H:%M:%S')} {describe(action, detail)}"
                f"{f' on CUDA devices {devices}' if devices else ''}\n$ {shlex.join(command)}\n"
            )
            log.flush()
            job.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env={**os.environ, **environment},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: the terminal's Ctrl-C reaches the launcher only, which
                # stops the jobs its own way. The lock stays held while any job lives.
                start_new_session=True,
                pass_fds=(self.lock_fd,) if self.lock_fd is not None else (),
            )
        job.status, job.slot, job.started = "running", slot, time.monotonic()
        job.resumed = action == "resume"
        job.detail = describe(action, detail)
        _say(f"start   {job.label}: {job.detail}; log {_relative(job.log_path)}")
        self._write_state()

    def _reap(self) -> None:
        """Settle the jobs whose process has exited."""
        for job in self.jobs:
            if job.status != "running" or job.process.poll() is None:
                continue
            code = job.process.returncode
            self.free_slots.append(job.slot)
            self.free_slots.sort()
            seconds = time.monotonic() - job.started
            if code == 0:
                action, detail = assess(job)
                if action == "skip":
                    status = "resumed" if job.resumed else "done"
                elif job.kind == "train":
                    status = "stopped"  # by a signal, yet saved: exit 0
                    detail = f"checkpoint {detail}" if action == "resume" else detail
                else:
                    status, detail = "failed", f"exit 0 but {detail}"
            elif self.stop_signals:
                # An evaluation dies of SIGTERM; `accelerate launch` forwards it to its
                # processes, which save, then exits 1 itself.
                status, detail = "stopped", f"{_exit_text(code)} after the stop signal"
                if job.kind == "train" and (reached := assess(job))[0] != "start":
                    detail += f"; checkpoint {reached[1]}"
            else:
                status, detail = "failed", _exit_text(code)
                if line := _last_line(job.log_path):
                    detail += f": {line}"
            self._settle(job, status, code, detail, seconds)

    def _settle(
        self,
        job: LocalJob,
        status: str,
        code: int | None,
        detail: str,
        seconds: float | None = None,
    ) -> None:
        job.status, job.exit_code, job.detail, job.seconds = status, code, detail, seconds
        took = f" in {_duration(seconds)}" if seconds is not None else ""
        log = f"; log {_relative(job.log_path)}" if status in ("failed", "stopped") else ""
        _say(f"{status:<7s} {job.label}{took}: {detail}{log}")
        self._write_state()

    # ---------------------------------------------------------------------------------------
    # State file and summary
    # ---------------------------------------------------------------------------------------

    def _write_state(self) -> None:
        """One row per job, rewritten whole (atomically) at every change."""
        rows = ["job\tstatus\texit_code\tseconds\tpid\tprogress\tlog"]
        for job in self.jobs:
            pid = job.process.pid if job.status == "running" else ""
            cells = [
                job.label,
                job.status,
                "" if job.exit_code is None else str(job.exit_code),
                "" if job.seconds is None else f"{job.seconds:.1f}",
                str(pid),
                job.detail,
                str(job.log_path) if job.log_path.exists() else "",
            ]
            rows.append("\t".join(cell.replace("\t", " ").replace("\n", " ") for cell in cells))
        temporary = self.state_path.with_name(f".{self.state_path.name}.tmp")
        temporary.write_text("\n".join(rows) + "\n")
        os.replace(temporary, self.state_path)

    def _summarize(self) -> int:
        """Print the table of every job and what is left; return the exit status."""
        header = ("job", "status", "exit", "time", "progress")
        rows = [
            (
                job.label,
                job.status,
                "" if job.exit_code is None else str(job.exit_code),
                "" if job.seconds is None else _duration(job.seconds),
                job.detail,
            )
            for job in self.jobs
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
        print()
        for row in [header, *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
            print("  ".join([*cells, row[-1]]))
        counts = {status: sum(job.status == status for job in self.jobs) for status in STATUSES}
        summary = ", ".join(f"{count} {status}" for status, count in counts.items() if count)
        print(f"\n{len(self.jobs)} job(s): {summary}; state in {_relative(self.state_path)}")
        left = len(self.jobs) - sum(counts[status] for status in FINISHED)
        if self.stop_signals:
            name = signal.Signals(self.stop_signals[0][0]).name
            print(
                f"stopped by {name}: {left} job(s) left; run the same command again to continue "
                "(finished jobs are skipped, stopped runs resume)",
                file=sys.stderr,
            )
            return 128 + self.stop_signals[0][0]
        if left:
            print(
                f"{counts['failed']} job(s) failed, {counts['not run'] + counts['stopped']} not "
                "finished: see their logs; run the same command again to retry them (finished "
                "jobs are skipped, interrupted runs resume)",
                file=sys.stderr,
            )
            return 1
        return 0


def run_local(
    campaign: CampaignConfig,
    jobs: list[Job],
    configs: list[Any],
    settings: LocalSettings,
    campaign_dir: Path,
    *,
    dry_run: bool = False,
) -> int:
    """Run (or with `dry_run` print) the checked jobs of a campaign on this machine.

    Exit status: 0 every job finished (now or before); 1 a job failed or did not finish, the
    others went on; 2 another launcher is running this campaign; 128 + N stopped by signal N.
    """
    state_dir = campaign_dir / "local"
    local_jobs = [
        LocalJob(job, config, state_dir / f"{job.script_path.name.removesuffix('.sbatch')}.log")
        for job, config in zip(jobs, configs, strict=True)
    ]
    devices = settings.device_groups[0]
    threads = f"{settings.torch_threads} torch thread(s) per process"
    if campaign.local.torch_threads is None:
        threads += (
            f" ({settings.cores} cores / ({settings.jobs} job(s) x {settings.processes} "
            "process(es)))"
        )
    print(
        f"campaign {campaign.name}: {len(jobs)} job(s), {settings.jobs} at a time, "
        f"{settings.processes} process(es) per run, {threads}"
        + (f", CUDA devices per job {settings.device_groups}" if devices else "")
    )
    if dry_run:
        return _print_dry_run(campaign, local_jobs, settings)

    state_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        print(
            f"error: {state_dir / LOCK_FILE} is held: another launcher, or jobs it started, "
            f"still run campaign {campaign.name} (see {state_dir / STATE_FILE})",
            file=sys.stderr,
        )
        return 2
    try:
        os.ftruncate(lock_fd, 0)
        os.write(lock_fd, f"{os.getpid()}\n".encode())
        return LocalRunner(campaign, local_jobs, settings, state_dir, lock_fd).run()
    finally:
        os.close(lock_fd)


def _print_dry_run(campaign: CampaignConfig, jobs: list[LocalJob], settings: LocalSettings) -> int:
    cuda = any(settings.device_groups)
    to_run, finished = 0, set()
    for job in jobs:
        action, detail = assess(job)
        if action == "skip":
            finished.add(id(job.job))
        to_run += action != "skip"
        if action != "skip" and job.job.after is not None and id(job.job.after) not in finished:
            what = f"start after {job.job.after.label}"
        else:
            what = describe(action, detail)
        port = "<free port>" if settings.processes > 1 else None
        command = job_command(job.job, campaign.local, cuda=cuda, port=port)
        command += action_arguments(job, action)
        threads = settings.torch_threads * (1 if job.kind == "train" else settings.processes)
        # Devices depend on the slot a job gets: the header line lists them.
        environment = job_environment(campaign.local, threads, [])
        environment.pop("PYTHONPATH")
        print(f"### {job.label}: {what}")
        print(f"$ {shlex.join(command)}")
        print(f"  env: {' '.join(f'{k}={shlex.quote(v)}' for k, v in environment.items())}")
        print(f"  log: {job.log_path}\n")
    print(
        f"dry run: {len(jobs)} job(s) checked, {to_run} to run, {len(jobs) - to_run} already "
        "finished; nothing written or started"
    )
    return 0


def _say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def _exit_text(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def _last_line(path: Path) -> str:
    """The last non-empty line of a log (its error message, usually)."""
    try:
        with path.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
            lines = file.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")[:300]


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
