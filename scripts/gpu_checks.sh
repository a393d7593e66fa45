#!/usr/bin/env bash
# The checks a GPU machine is for, in one short run: the gpu-marked tests, then the benchmarks on CUDA with and
# without the CUDA-graph pool. Needs torch + transformers + pytest (not verl). Usage, from the repository root:
#   VERL_TLT_CACHE=<copy of ~/.cache/verl-tlt with the toy target and drafters> bash scripts/gpu_checks.sh OUT_DIR
# (e.g. copy toy-target-v1-seed0 and toy-drafter-v5-toy-target-v1-seed0-steps1200 into .gpu_cache/, which git
# ignores, and set VERL_TLT_CACHE=$PWD/.gpu_cache: nothing then needs training on the GPU machine).
# Each step has its own time limit and the script goes on after a failure, so that one broken step does not cost
# the rest of a short GPU session; the limits add up to about 25 minutes, more than one session's device time: name the
# steps to run, e.g. GPU_CHECKS_STEPS="spot_7b verify_qwen2.5-7b" bash scripts/gpu_checks.sh OUT_DIR (default: all).
# spot_7b and verify_qwen2.5-7b need only torch and transformers and no cache: the drafter placement issue's check.
# Results: OUT_DIR/*.json and *.log.
set -u
out="${1:?usage: scripts/gpu_checks.sh OUT_DIR}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    if [ -n "${GPU_CHECKS_STEPS:-}" ] && [[ " $GPU_CHECKS_STEPS " != *" $name "* ]]; then
        return 0
    fi
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "=== $name: exit $?"
    tail -n 15 "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
step gpu_tests 150 "$python" -m pytest -q -m gpu tests/engine/test_engine_cuda.py tests/engine/drafts/test_eagle_forward.py \
    tests/bench/test_verify_bench.py tests/drafter/test_precision.py tests/drafter/test_spot.py \
    tests/bench/test_spot_bench.py tests/warmup/test_cli.py
# Spot training on the GPU at the 7B drafter's shape (152k head, random weights, the worker's own SpotTrainer): trained
# tokens/s and peak memory at 4096 tokens for depths 1 and 3, onload/offload and stop latency, nothing left on the
# device after offload, the per-step score on 16k tokens, bf16 vs fp32 loss, and in-place weight copies into a
# CUDA-graph-captured drafter forward against eager. Goals: >= 20k tokens/s at depth 1, stop <= 0.5 s, onload +
# offload <= 2 s. Estimated (never run): the 7B parts built on the host (about 20 s), then under 3 minutes.
step spot_7b 420 "$python" -m verl_tlt.cli bench spot --device cuda --shape qwen2.5-7b --depths 1 3 \
    --json "$out/spot_7b_cuda.json"
step sd_graphs 120 "$python" -m verl_tlt.cli bench sd curve --device cuda --cuda-graphs --strategies 4_1_4 2_1_2 \
    --acceptance-prompts 8 --json "$out/sd_graphs.json"
step sd_plain 120 "$python" -m verl_tlt.cli bench sd curve --device cuda --strategies 4_1_4 2_1_2 \
    --acceptance-prompts 8 --json "$out/sd.json"
step adaptive_graphs 160 "$python" -m verl_tlt.cli bench adaptive --device cuda --cuda-graphs \
    --json "$out/adaptive_graphs.json"
# The simulator's calibration: the engine's bf16 target forward in Qwen2.5-7B's shape (random weights, built on the
# GPU), plain decode (k = 0) and verify widths 2-64 at batch 1-64. The SD-overhead part is skipped (--sd-steps 0) so
# that nothing but the forward grid stands between the run and its JSON. Estimated (never run) at about a minute on
# an H100/H200, model build included; the limit leaves room for a slower start.
step verify_qwen2.5-7b 180 "$python" -m verl_tlt.cli bench verify --device cuda --model qwen2.5-7b \
    --dtypes bfloat16 --batch-sizes 1 2 4 8 16 32 64 --ks 0 1 2 4 8 16 32 63 --repeats 5 --sd-steps 0 \
    --json "$out/verify_qwen2.5-7b_cuda.json"
# The drafter trainer's cost, dense recipe against sparse labels + draft vocabulary, at the toy, SmolLM2 and 7B
# shapes (random weights built on the GPU), 4096 pairs a step, bf16 autocast where the device runs it. Never run on a
# GPU yet; at 7B the three recipes' drafter and optimizer (about 3 GB each in fp32) come one after another.
step drafter_train 180 "$python" -m verl_tlt.cli bench drafter-train --device cuda --rounds 5 \
    --json "$out/drafter_train_cuda.json"
