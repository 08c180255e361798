#!/usr/bin/env bash
# The GPU check: what issue 13 asks to work on one GPU (and on N), the nccl failure tests, and
# the benchmark on CUDA; a summary table at the end (and in $OUT/gpu_check.md when OUT is set).
#
#   bash benchmarks/gpu_check.sh            # on a machine with CUDA torch and >= 1 GPU
#   GPU_CHECK_QUICK=1 bash benchmarks/gpu_check.sh   # the device tests alone (a few minutes)
#
# Each line runs under its own time limit; a line that fails is reported and the rest still
# run. The exit code is the number of lines that failed (0: all passed).
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-benchmarks/results}"
mkdir -p "$out_dir"
log_dir="$out_dir/gpu_check_logs"
mkdir -p "$log_dir"
summary="$out_dir/gpu_check.md"
limit="${GPU_CHECK_LIMIT_S:-900}"

gpus=$(python3 -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$gpus" -lt 1 ]; then
  echo "no GPU is visible to torch here: nothing to check" >&2
  exit 2
fi
about=$(python3 - <<'PY'
import datetime, torch
nccl = ".".join(map(str, torch.cuda.nccl.version()))
print(f"{datetime.date.today()}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, "
      f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}")
PY
)
q=(-p no:cacheprovider -q -rfEs)
rows=()
failed=0

step() {  # step NAME COMMAND...
  local name="$1"; shift
  local log="$log_dir/$(echo "$name" | tr -c 'A-Za-z0-9' '_').log"
  local start=$SECONDS
  echo "== $name: $*"
  timeout "$limit" "$@" >"$log" 2>&1
  local code=$?
  local took=$((SECONDS - start))
  local tail_line
  tail_line=$(grep -E "passed|failed|error|equivalent|skipped" "$log" | tail -1 | cut -c1-120)
  echo "   exit $code in ${took} s: $tail_line"
  [ "$code" -eq 0 ] || failed=$((failed + 1))
  rows+=("| $name | $code | $took | ${tail_line//|/\\|} |")
}

check=(ddp-verify check fixtures/grad_sync.py:sample_weighted --kind grad-sync)

# The device tests: what listens (NCCL's sockets on loopback), parity on a script that trains
# on GPUs, the failure contract (each skips without GPUs elsewhere).
step "tests: nccl world listens on loopback" python3 -m pytest tests/world/test_listening.py -n 0 "${q[@]}" -k nccl
step "tests: parity on GPUs" python3 -m pytest tests/parity/test_parity.py -n 0 "${q[@]}" -k gpus
step "tests/world/test_cuda.py" python3 -m pytest tests/world/test_cuda.py -n 0 "${q[@]}"
step "check, nccl, 1 rank" "${check[@]}" --backend nccl --world-size 1
step "tests: a reproducer on nccl, on the GPU" python3 -m pytest tests/usercode/test_diagnosis.py -n 0 "${q[@]}" -k backend_and_device
if [ -n "${GPU_CHECK_QUICK:-}" ]; then
  rows+=("| (GPU_CHECK_QUICK: the examples, conformance and benchmark lines not run) | | | |")
fi

# One GPU is enough: nccl with one rank, and gloo with four ranks sharing the GPU.
if [ -z "${GPU_CHECK_QUICK:-}" ]; then
step "examples, nccl, 1 rank" python3 -m pytest examples "${q[@]}" --ddp-backend nccl --world-size 1
step "examples, gloo on cuda, 4 ranks" python3 -m pytest examples "${q[@]}" --ddp-device cuda --world-size 4
step "check, gloo on cuda, 4 ranks" "${check[@]}" --device cuda --world-size 4
step "check, bfloat16 on cuda" "${check[@]}" --device cuda --world-size 4 --dtype bfloat16
step "conformance, nccl, 1 rank" python3 -m pytest --pyargs ddp_verify.conformance "${q[@]}" --ddp-backend nccl --world-size 1
step "conformance, gloo on cuda, 4 ranks" python3 -m pytest --pyargs ddp_verify.conformance "${q[@]}" --ddp-device cuda --world-size 4
if [ "$gpus" -gt 1 ]; then
  step "examples, nccl, $gpus ranks" python3 -m pytest examples "${q[@]}" --ddp-backend nccl --world-size "$gpus"
  step "conformance, nccl, $gpus ranks" python3 -m pytest --pyargs ddp_verify.conformance "${q[@]}" --ddp-backend nccl --world-size "$gpus"
fi
# The benchmark: CPU tensors (the 16-core figures), then CUDA tensors.
# Two rounds per example, not five: the curve must fit the few minutes a lent machine gives
# the whole check (its time there is not measured yet).
step "bench, cpu, ws 2,4,8,16" python3 benchmarks/bench.py --sizes 2,4,8,16 --rounds 2 --out "$out_dir/bench_cpu.json"
step "bench, cuda, ws 1,4" python3 benchmarks/bench.py --device cuda --sizes 1,4 --out "$out_dir/bench_cuda.json"
fi

{
  echo "GPU check, $about"
  echo
  echo "| line | exit | s | last line |"
  echo "| --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} >"$summary"
echo
cat "$summary"
exit "$failed"
