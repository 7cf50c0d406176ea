#!/usr/bin/env bash
# kernels.bench on a GPU machine lent through the session's `device` tool (not for users:
# on your own GPU box run `python -m kernels.bench` directly).
#
# That tool sends at most 64 MiB per call, and SmolLM2's GGUF is 94 MiB, so the model
# travels split in two, over two calls to the same warm machine. The plan (two calls, about
# 4 minutes each, ~10 minutes of device time with the machine's start):
#
#   prepare here:  bash scripts/device_bench.sh split
#                  (fills .gpu/, git-ignored: both carries, ready before call 1; refuses when
#                  benchmarks/results/engine_gpu_cpu_refs.json is stale: refresh it first with
#                  `KTCLI_NO_CPP_KERNELS=1 .venv/bin/python -m benchmarks.engine_gpu --make-refs`,
#                  10-60 min of CPU here, never device time)
#   call 1:        carry [.gpu/a, .gpu/whl]   timeout_s 300
#                  command: bash scripts/device_bench.sh stage-bench
#                  (stages part 1, then checks every kind and times the kernels:
#                  kernels.bench --no-e2e, ~4 min; $OUT gets kernels_gpu.json and .log)
#   call 2:        carry [.gpu/b, .gpu/whl]   timeout_s 300
#                  command: bash scripts/device_bench.sh e2e
#                  (joins the model, runs benchmarks.engine_gpu on fp32 weights against the
#                  committed CPU references, int4 and int8 first; $OUT gets engine_gpu.json and .log)
#
# Call 2 must follow call 1 AT ONCE: the machine goes back after `idle_release_s` (30 s when
# this was written) without a call, and part 1 of the model lives in its /tmp. So: have
# both carries prepared before call 1, issue call 2 as soon as call 1 returns, and read
# call 1's output afterwards. A call 2 that lands on a fresh machine pays its start (minutes
# of the device budget) and exits 3 at once ("part 1 ... is not on this machine").
# A stale reference file does not waste call 2: its rows keep their tokens, and
# `python -m benchmarks.engine_gpu --rematch engine_gpu.json` compares them here later with
# refreshed references.
#
# Other modes: `stage` (copy part 1 only) then `run` (everything in one call: kernels.bench
# with its end-to-end part, under 5 minutes by its budgets; see kernels/bench.py).
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
    # The end-to-end part reads the committed CPU references; stale ones would leave its
    # rows without a comparison (DEVICE_BENCH_STALE_REFS=1 goes on anyway: --rematch later).
    if ! .venv/bin/python -m benchmarks.engine_gpu --check-refs; then
        [ "${DEVICE_BENCH_STALE_REFS:-}" = 1 ] || { echo "device_bench: refresh the CPU references first (see the header)" >&2; exit 1; }
    fi
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
    # fp32 weights: each page kind against its own CPU reference (the kernels' exactness);
    # the budget covers the GGUF's conversion (~28 s) and every device row.
    python3 -m benchmarks.engine_gpu --model "$STAGE/$GGUF" --weights fp32 --budget-s 220 \
        --out "$OUT/engine_gpu.json" "${@:2}" 2>&1 | tee "$OUT/engine_gpu.log"
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
    python3 -m kernels.bench --e2e-weights fp32 --out "$OUT/kernels_gpu.json" "${model[@]}" "${@:2}" 2>&1 | tee "$OUT/kernels_gpu.log"
    ;;
*)
    echo "usage: bash scripts/device_bench.sh split|stage-bench|e2e|stage|run [flags]" >&2
    exit 2
    ;;
esac
