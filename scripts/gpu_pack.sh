#!/usr/bin/env bash
# Build .gpu/: what scripts/gpu_check.sh needs on a GPU machine that has no network and lacks
# some of glam's packages (docs/gpu.md). Run it here, from the repository root, with PyPI
# reachable:
#
#   bash scripts/gpu_pack.sh            # wheels + the embedded model's architecture (~23 MB)
#   bash scripts/gpu_pack.sh --gguf     # also the embedded model's GGUF file in two parts
#
# .gpu/wheels/       the packages the GPU machine lacks, for its Python (3.12, x86-64): minigrid
#                    and gymnasium, hydra-core and omegaconf, datasets, RestrictedPython,
#                    pygame-ce (minigrid imports it), gguf, DeepSpeed and what they need; the
#                    versions of this checkout's .venv. PyPI has no wheel of DeepSpeed nor of
#                    antlr4-python3-runtime: both are built here (pure Python).
# .gpu/smollm2-135m-arch/  SmolLM2-135M's config and tokenizer, no weights: the check builds
#                    random weights of that architecture for its throughput steps.
# .gpu/gguf-1/, .gpu/gguf-2/  (--gguf) the 98 MB GGUF file in two parts: the first travels with
#                    the wheels, the second alone, each call under 64 MiB with the working tree:
#                    the pretrained weights over two calls on the same machine (docs/gpu.md).
#
# It ends with the size of each part and of the working tree, and fails when a call's load
# would pass 64 MiB.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEST=.gpu
PY=${GLAM_PY:-.venv/bin/python}
LIMIT=$((64 * 1024 * 1024))
MARGIN=$((1024 * 1024))  # what the tree may gain before the call
GGUF=0
for arg in "$@"; do
    case $arg in
        --gguf) GGUF=1 ;;
        *) echo "error: unknown option $arg (gpu_pack.sh takes only --gguf)" >&2; exit 2 ;;
    esac
done
if [[ ! -x $PY ]]; then  # checked before the earlier pack is removed
    echo "error: no Python at $PY: run make install first (or set GLAM_PY)" >&2
    exit 2
fi

# name in the .venv -> name on PyPI; pure Python unless noted
PACKAGES=(minigrid gymnasium farama-notifications hydra-core omegaconf datasets dill multiprocess
    restrictedpython gguf hjson pydantic pydantic-core annotated-types typing-inspection pygame-ce)
BUILT=(antlr4-python3-runtime deepspeed)  # sdists only on PyPI

version() { "$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1"; }

rm -rf "$DEST/wheels" "$DEST/smollm2-135m-arch" "$DEST/gguf-1" "$DEST/gguf-2"
mkdir -p "$DEST/wheels"
pins=()
for name in "${PACKAGES[@]}"; do pins+=("$name==$(version "$name")"); done
echo "[gpu_pack] downloading ${pins[*]}"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST/wheels" "${pins[@]}"
built=()
for name in "${BUILT[@]}"; do built+=("$name==$(version "$name")"); done
echo "[gpu_pack] building ${built[*]} (no compiled ops)"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST/wheels" "${built[@]}"

# The embedded model's architecture: its converted folder (scripts/prepare_models.py) less the
# weights.
model_dir=$("$PY" -c 'from glam.models.loading import prepare_embedded_model as p; print(p(verbose=False))')
mkdir -p "$DEST/smollm2-135m-arch"
for file in "$model_dir"/*; do
    [[ $file == *.safetensors ]] || cp "$file" "$DEST/smollm2-135m-arch/"
done

size() { du -cb "$@" 2>/dev/null | tail -n 1 | cut -f 1; }
tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f 1)
first=$(size "$DEST/wheels" "$DEST/smollm2-135m-arch")
if ((GGUF)); then
    gguf=$("$PY" -c 'from glam.models.loading import _package_dir as p; from glam.models.specs import EMBEDDED_MODELS as m; e = m["smollm2-135m"]; print(p(e.package) / e.gguf_file)')
    # Two calls of the same load: the wheels and the first part, then the second part alone
    # (the architecture folder stays behind: the GGUF file holds the tokenizer).
    wheels=$(size "$DEST/wheels")
    head_bytes=$((($(stat -c %s "$gguf") - wheels) / 2))
    mkdir -p "$DEST/gguf-1" "$DEST/gguf-2"
    head -c "$head_bytes" "$gguf" >"$DEST/gguf-1/part"
    tail -c +$((head_bytes + 1)) "$gguf" >"$DEST/gguf-2/part"
    sha256sum "$gguf" | cut -d ' ' -f 1 >"$DEST/gguf-1/sha256"
    cp "$DEST/gguf-1/sha256" "$DEST/gguf-2/sha256"
    basename "$gguf" >"$DEST/gguf-1/name"
    cp "$DEST/gguf-1/name" "$DEST/gguf-2/name"
fi

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "[gpu_pack] working tree $(mib "$tree"); wheels $(mib "$(size "$DEST/wheels")") ($(find "$DEST/wheels" -name '*.whl' | wc -l) wheels); architecture $(mib "$(size "$DEST/smollm2-135m-arch")")"
calls=("$((tree + first))")
if ((GGUF)); then
    calls=("$((tree + wheels + $(size "$DEST/gguf-1")))" "$((tree + $(size "$DEST/gguf-2")))")
    echo "[gpu_pack] GGUF parts $(mib "$(size "$DEST/gguf-1")") + $(mib "$(size "$DEST/gguf-2")")"
fi
status=0
for i in "${!calls[@]}"; do
    echo "[gpu_pack] call $((i + 1)) carries $(mib "${calls[i]}") of 64 MiB"
    if ((calls[i] > LIMIT - MARGIN)); then
        echo "[gpu_pack] call $((i + 1)) would be over the limit" >&2
        status=1
    fi
done
exit "$status"
