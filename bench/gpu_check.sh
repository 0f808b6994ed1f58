#!/usr/bin/env bash
# The prepared GPU check (issue 17): one H200, nothing reachable but the package registries, 8 minutes.
#
#   bash bench/gpu_check.sh            # from the repository root; results under bench/out/gpu_check/
#
# 1. installs .venv-gpu: vLLM 0.32.0 for CUDA (it brings its CUDA torch 2.13.0), the project without its
#    deps (vLLM's are the `vllm` extra's), and what the engine and the tests import;
# 2. runs on CUDA the native talker's CUDA-graph tests and conformance, and the vLLM tier
#    (tests/vllm_talker with VOXGATE_TEST_DEVICE=cuda: exactness vs the native talker, cancel, KV);
# 3. writes random-weight checkpoints at the real 0.6B and 1.7B sizes (bench/random_checkpoint.py; on
#    the CPU, in the background while 2. runs);
# 4. for each: engine frames/s, TTFA p50/p95 and underruns at 1, 8, 32 and 64 streams, native
#    (cuda_graphs) vs vLLM, side by side (bench/talker_bench.py);
# 5. bench/load.py against a gateway serving deploy/voxgate-gpu.toml with the 0.6B checkpoint at rising
#    Poisson rates, native then vLLM.
#
# Every phase has its own time limit, cut to what is left of the 470 s budget, so a slow one cannot eat
# the rest; the summary at the end says what ran and what was cut. vLLM compiles and captures CUDA
# graphs at start-up (enforce_eager off on CUDA): that start-up is inside each bench phase's limit.
# Not run yet: no GPU has been lent to a session since it was written (docs/vllm.md).
set -uo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 VLLM_HOST_IP=127.0.0.1
OUT=bench/out/gpu_check
mkdir -p "$OUT"
T0=$SECONDS
declare -a SUMMARY=()
BUDGET=${BUDGET:-470}
phase() { echo; echo "== [$((SECONDS - T0)) s] $*"; }
limit() { local left=$((BUDGET - (SECONDS - T0))); echo $(( $1 < left ? $1 : (left > 1 ? left : 1) )); }
record() { SUMMARY+=("$1: rc $2 at $((SECONDS - T0)) s"); }

phase "install (limit 140 s)"
timeout "$(limit 140)" bash -c '
  set -e
  python3 -m venv .venv-gpu
  .venv-gpu/bin/pip install -q "vllm==0.32.0"
  .venv-gpu/bin/pip install -q --no-deps -e .
  .venv-gpu/bin/pip install -q numpy safetensors tokenizers pysbd jieba litestar uvicorn websockets msgspec \
    "pyzmq>=26,<28" redis "fakeredis[lua]" prometheus-client soxr soundfile pytest pytest-asyncio pytest-timeout \
    hypothesis httpx
'
rc=$?; record install $rc
[ $rc -eq 0 ] || { echo "install failed"; printf '%s\n' "${SUMMARY[@]}"; exit 1; }
PY=.venv-gpu/bin/python
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__)" \
  | tee -a "$OUT/gpu.txt"

# The checkpoints are CPU work: written in the background while the GPU runs the tests.
CK=/tmp/voxgate-gpu-check
$PY bench/random_checkpoint.py 0.6b $CK/0.6b > "$OUT/checkpoint_0.6b.log" 2>&1 &
ck_small=$!
$PY bench/random_checkpoint.py 1.7b $CK/1.7b > "$OUT/checkpoint_1.7b.log" 2>&1 &
ck_large=$!

phase "native talker on CUDA: CUDA graphs + conformance (limit 35 s)"
timeout "$(limit 35)" $PY -m pytest -q -p no:cacheprovider tests/engine/test_graphs.py tests/engine/test_talker_conformance.py \
  2>&1 | tail -5 | tee "$OUT/native_tests.txt"
record native_tests "${PIPESTATUS[0]}"

phase "vLLM tier on CUDA (limit 60 s)"
VOXGATE_TEST_DEVICE=cuda timeout "$(limit 60)" $PY -m pytest -q -p no:cacheprovider -m vllm tests/vllm_talker \
  2>&1 | tail -8 | tee "$OUT/vllm_tests.txt"
record vllm_tests "${PIPESTATUS[0]}"

phase "random-weight checkpoints 0.6B and 1.7B (written since the install; waiting at most 60 s more)"
wait_until=$((SECONDS + $(limit 60)))
for pid in $ck_small $ck_large; do
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $wait_until ]; do sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then kill "$pid"; record "checkpoint pid $pid" timeout; else
    wait "$pid"; record "checkpoint pid $pid" $?; fi
done
tail -n 2 "$OUT"/checkpoint_*.log

for size in 0.6b 1.7b; do
  phase "engine bench $size: native (cuda_graphs) vs vLLM at 1,8,32,64 streams (limit 70 s)"
  timeout "$(limit 70)" $PY bench/talker_bench.py --talker native,vllm --model "$CK/$size" --device cuda --cuda-graphs \
    --concurrency 1,8,32,64 --frames 50 --threads 4 --json "$OUT/talkers_$size.json" 2>&1 \
    | grep -v -E "^(INFO|WARNING|\(EngineCore)" | tail -12 | tee "$OUT/talkers_$size.txt"
  record "talkers_$size" "${PIPESTATUS[0]}"
done

for talker in native vllm; do
  phase "bench/load.py, 0.6B on $talker, Poisson 2,8 responses/s (limit 45 s with start-up)"
  port=$((18400 + RANDOM % 500))
  # --admin-open-loopback: bench/load.py reads the engine's busy share from /metrics (the admin plane's).
  # The shipped GPU config (device "cuda", docs/gpu.md), with the random checkpoint in place of a real one.
  .venv-gpu/bin/voxgate serve --config deploy/voxgate-gpu.toml --model "$CK/0.6b" --talker "$talker" --port "$port" \
    --in-process --admin-open-loopback > "$OUT/serve_$talker.log" 2>&1 &
  server=$!
  up=$((SECONDS + $(limit 30)))
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null || [ $SECONDS -ge $up ]; do sleep 1; done
  timeout "$(limit 15)" $PY bench/load.py --url "http://127.0.0.1:$port" --rates 2,8 --duration 5 --modes auto \
    --json "$OUT/load_$talker.json" 2>&1 | tail -12 | tee "$OUT/load_$talker.txt"
  record "load_$talker" "${PIPESTATUS[0]}"
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
done

phase "summary (total $((SECONDS - T0)) s)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
