#!/usr/bin/env bash
# kernels.bench on a GPU machine lent through the session's `device` tool (not for users:
# on your own GPU box run `python -m kernels.bench` directly).
#
# That tool sends at most 64 MiB per call, and SmolLM2's GGUF is 94 MiB, so the model
# travels split in two, over two calls to the same warm machine:
#   prepare here:  bash scripts/device_bench.sh split        (fills .gpu/, git-ignored)
#   call 1:        carry [.gpu/a, .gpu/whl]   command: bash scripts/device_bench.sh stage
#   call 2:        carry [.gpu/b, .gpu/whl]   command: bash scripts/device_bench.sh run [kernels.bench flags]
# Call 2 must come within the machine's idle window; when part 1 is gone (a fresh
# machine) the kernels are still checked and timed and the end-to-end part says why not.
# Everything lands in $OUT: kernels_gpu.json and kernels_gpu.log.
#
# Or, so that neither call only waits on a transfer, split the work itself:
#   call 1:        carry [.gpu/a, .gpu/whl]   command: bash scripts/device_bench.sh stage-bench [kernels.bench flags]
#                  (stages part 1, then checks and times the kernels: kernels.bench --no-e2e)
#   call 2:        carry [.gpu/b, .gpu/whl]   command: bash scripts/device_bench.sh e2e [engine_gpu flags]
#                  (joins the model, runs benchmarks.engine_gpu; exits 3 at once without part 1)
set -u
STAGE=/tmp/ktcli_gpu
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf

# The packages the image lacks, the environment the benches run in, and the machine in the log.
device_env() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    export KTCLI_CACHE_DIR=/tmp/ktcli_cache KTCLI_NO_CPP_KERNELS=1  # CPU references: torch path, no C++ build
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    echo "cpus $(nproc); $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
}

case "${1:-}" in
split)
    src=$(.venv/bin/python -c "from ktcli.engine.model_store import resolve_model; print(resolve_model('smollm2').path)") || exit 1
    rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/whl
    grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >>.git/info/exclude
    split -b 47M -d "$src" .gpu/part
    mv .gpu/part00 .gpu/a/smollm2.part00 && mv .gpu/part01 .gpu/b/smollm2.part01
    sha256sum "$src" | cut -d' ' -f1 >.gpu/b/smollm2.sha256
    # The GPU image lacks these two (pure-Python) packages; the rest is there.
    python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/whl gguf==0.19.0 platformdirs
    du -sh .gpu/*
    ;;
stage)
    mkdir -p "$STAGE" && cp .gpu/a/smollm2.part00 "$STAGE/" && ls -l "$STAGE"
    nvidia-smi -L
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    ;;
stage-bench)
    mkdir -p "$STAGE" && cp .gpu/a/smollm2.part00 "$STAGE/"
    device_env
    set -o pipefail
    python3 -m kernels.bench --no-e2e --out "$OUT/kernels_gpu.json" "${@:2}" 2>&1 | tee "$OUT/kernels_gpu.log"
    ;;
e2e)
    [ -f "$STAGE/smollm2.part00" ] || { echo "device_bench: part 1 of the model is not on this machine (a fresh one?)" >&2; exit 3; }
    device_env
    cat "$STAGE/smollm2.part00" .gpu/b/smollm2.part01 >"$STAGE/$GGUF"
    [ "$(sha256sum "$STAGE/$GGUF" | cut -d' ' -f1)" = "$(cat .gpu/b/smollm2.sha256)" ] || { echo "device_bench: the joined GGUF has the wrong sha256" >&2; exit 3; }
    set -o pipefail
    python3 -m benchmarks.engine_gpu --model "$STAGE/$GGUF" --out "$OUT/engine_gpu.json" "${@:2}" 2>&1 | tee "$OUT/engine_gpu.log"
    ;;
run)
    device_env
    model=()
    if [ -f "$STAGE/smollm2.part00" ]; then
        cat "$STAGE/smollm2.part00" .gpu/b/smollm2.part01 >"$STAGE/$GGUF"
        if [ "$(sha256sum "$STAGE/$GGUF" | cut -d' ' -f1)" = "$(cat .gpu/b/smollm2.sha256)" ]; then
            model=(--model "$STAGE/$GGUF")
        else
            echo "device_bench: the joined GGUF has the wrong sha256" >&2
        fi
    else
        echo "device_bench: part 1 of the model is not on this machine (a fresh one?)" >&2
    fi
    [ ${#model[@]} -gt 0 ] || model=(--model "$STAGE/missing.gguf")  # the e2e rows then say why
    set -o pipefail
    python3 -m kernels.bench --out "$OUT/kernels_gpu.json" "${model[@]}" "${@:2}" 2>&1 | tee "$OUT/kernels_gpu.log"
    ;;
*)
    echo "usage: bash scripts/device_bench.sh split|stage|run" >&2
    exit 2
    ;;
esac
