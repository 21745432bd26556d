# Shared by the sbatch templates in slurm/: sourced, not run.
#
# The requeue path: the job asks for `--signal=B:USR1@SECONDS`, so SLURM sends USR1 to the
# batch shell only, SECONDS before the time limit. The shell forwards it to the job step (srun
# signals every process of the step), the training processes save a checkpoint and exit, and the
# shell then runs `scontrol requeue`. The requeued job runs the same script, whose training
# command carries `train.resume=true`, so it continues from the newest checkpoint by itself.
#
# Environment read here (all optional):
#   GLAM_ROOT            repository root (default: the folder sbatch was called from)
#   GLAM_TRAIN_SCRIPT    training entry point (default: scripts/train_language_agent.py)
#   GLAM_EVAL_SCRIPT     evaluation entry point (default: scripts/post_training_tests.py)
#   GLAM_GPUS_PER_NODE   processes per node (default: SLURM_GPUS_ON_NODE; 0 runs one CPU process)
#   GLAM_MAX_REQUEUES    stop requeuing after this many restarts (default: 20)
#   GLAM_RESIGNAL_SECONDS  repeat USR1 this often until the training stops (default: 60)
#   GLAM_VENV            virtual environment to activate (default: $GLAM_ROOT/.venv if present)

# glam_job_init: catch USR1 from here on, go to the repository, activate its environment, and
# print where and what runs.
glam_job_init() {
    _glam_preempted=0
    _glam_step_pid=
    _glam_signal_time=0
    trap _glam_on_usr1 USR1
    GLAM_ROOT=${GLAM_ROOT:-$SLURM_SUBMIT_DIR}
    cd "$GLAM_ROOT" || return 1
    export GLAM_ROOT
    export GLAM_TRAIN_SCRIPT=${GLAM_TRAIN_SCRIPT:-scripts/train_language_agent.py}
    export GLAM_EVAL_SCRIPT=${GLAM_EVAL_SCRIPT:-scripts/post_training_tests.py}
    export GLAM_GPUS_PER_NODE=${GLAM_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-0}}
    local venv=${GLAM_VENV:-$GLAM_ROOT/.venv}
    if [[ -z ${VIRTUAL_ENV:-} && -f $venv/bin/activate ]]; then
        # shellcheck disable=SC1091
        source "$venv/bin/activate"
    fi
    echo "[glam] job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}:" \
        "${SLURM_NNODES} node(s) x ${GLAM_GPUS_PER_NODE} GPU(s), $(date -Iseconds)"
}

# glam_accelerate_layout: `accelerate launch` options for the processes of one node.
#
# `--multi_gpu` only when GLAM_ACCELERATE_ARGS picks no launch mode itself: accelerate 1.x reads
# the distributed type of a `--config_file` only when no mode flag was given, so `--multi_gpu`
# beside `--config_file configs/accelerate/zero2.yaml` would run plain DDP, without a word.
glam_accelerate_layout() {
    local processes=$((SLURM_NNODES * GLAM_GPUS_PER_NODE))
    if ((GLAM_GPUS_PER_NODE == 0)); then
        echo "--cpu --num_processes 1"
    elif ((processes == 1)) || _glam_picks_launch_mode ${GLAM_ACCELERATE_ARGS:-}; then
        echo "--num_processes $processes"
    else
        echo "--multi_gpu --num_processes $processes"
    fi
}

# _glam_picks_launch_mode ARGS...: whether accelerate launch options choose how to distribute
# (a config file, or a mode flag of their own).
_glam_picks_launch_mode() {
    local arg
    for arg in "$@"; do
        case $arg in
            --config_file | --config_file=* | --config-file | --config-file=* | --use_deepspeed | \
                --use_fsdp | --use_megatron_lm | --multi_gpu | --cpu | --tpu) return 0 ;;
        esac
    done
    return 1
}

_glam_on_usr1() {
    _glam_preempted=1
    echo "[glam] USR1 at $(date -Iseconds): checkpoint, then requeue"
    _glam_forward_usr1
}

_glam_forward_usr1() {
    _glam_signal_time=$SECONDS
    if [[ -n $_glam_step_pid ]]; then
        echo "[glam] asking the training processes to checkpoint and stop"
        # srun relays USR1 to every process of the step, on every node.
        kill -USR1 "$_glam_step_pid" 2>/dev/null || true
    fi
}

# glam_run_requeueable CMD...: run CMD once per node as a job step; requeue the job after USR1.
#
# The step ignores USR1 before exec'ing CMD: the ignore is inherited by `accelerate launch` and
# its torch launcher (which USR1 would otherwise kill), while the training processes install
# their own handler and checkpoint. Requeuing does not depend on the training's exit code.
glam_run_requeueable() {
    local cpus=()
    if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
        # srun does not inherit --cpus-per-task from sbatch since SLURM 22.05.
        cpus=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
    fi
    local status=0
    if ((_glam_preempted)); then
        echo "[glam] USR1 came before training started; not starting it"
    else
        srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 "${cpus[@]}" --kill-on-bad-exit=1 \
            bash -c 'trap "" USR1; exec "$@"' glam-step "$@" &
        _glam_step_pid=$!
        local resignal=${GLAM_RESIGNAL_SECONDS:-60}
        while kill -0 "$_glam_step_pid" 2>/dev/null; do
            # A USR1 that lands before the training installs its handler is ignored (see
            # above): repeat it until the step ends.
            if ((_glam_preempted && SECONDS - _glam_signal_time >= resignal)); then
                _glam_forward_usr1
            fi
            sleep 1
        done
        wait "$_glam_step_pid" && status=0 || status=$?
        echo "[glam] training step exited with status $status"
    fi
    if ((_glam_preempted)); then
        local restarts=${SLURM_RESTART_COUNT:-0} max=${GLAM_MAX_REQUEUES:-20}
        if ((restarts >= max)); then
            echo "[glam] not requeuing: restart $restarts reached GLAM_MAX_REQUEUES=$max"
            return "$status"
        fi
        echo "[glam] requeuing job $SLURM_JOB_ID; it resumes from the newest checkpoint"
        scontrol requeue "$SLURM_JOB_ID"
        return 0
    fi
    return "$status"
}
