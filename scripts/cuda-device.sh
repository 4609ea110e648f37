#!/usr/bin/env bash
# The CUDA forward's checks on a GPU machine, in one call: the test against the float64 reference,
# the benchmark (every tile, beside cuBLAS's bf16 GEMM measured in the same run), then PyTorch's SDPA
# on the same workloads (bench/cuda_sdpa_peer.py). Run from the repository root; logs go to $OUT
# (the device tool's folder) or out/.
#
# Binaries: those in .cuda-bin/ when given and they load there (built elsewhere with
#   cmake -S . -B build-cuda -DFLASHGQA_CUDA=ON -DFLASHGQA_BUILD_TESTS=OFF
#   make -C build-cuda flashgqa_cuda_test flashgqa_cuda_bench
# and copied there with libgomp.so.1), else built here into build-cuda/.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
  --format=csv > "$out/smi.csv" 2>&1
cat "$out/smi.csv"

# cuBLAS from the CUDA toolkit or from PyTorch's wheels, whichever is there.
cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$PWD/.cuda-bin:${cublas_dir:-}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

bin=.cuda-bin
if [ ! -x "$bin/flashgqa_cuda_test" ] || ldd "$bin/flashgqa_cuda_test" "$bin/flashgqa_cuda_bench" | grep -q "not found"; then
  echo "building build-cuda/ here"
  start=$(date +%s)
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DFLASHGQA_CUDA=ON -DFLASHGQA_BUILD_TESTS=OFF > "$out/build.log" 2>&1 &&
    make -C build-cuda -j"$(nproc)" flashgqa_cuda_test flashgqa_cuda_bench >> "$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - start )) s"
  bin=build-cuda
fi

# The instructions the kernels use (mma.sync shows as HMMA, ldmatrix as LDSM, cp.async as LDGSTS,
# spills as LDL/STL).
cuobjdump --dump-sass "$bin/flashgqa_cuda_bench" 2>/dev/null |
  grep -o "HMMA[.A-Z0-9]*\|LDSM[.A-Z0-9]*\|LDGSTS[.A-Z0-9]*\|MUFU.EX2\|LDL[.0-9]*\|STL[.0-9]*" | sort | uniq -c

status=0
timeout 150 "$bin/flashgqa_cuda_test" > "$out/test.log" 2>&1 || status=1
grep -v "^ok" "$out/test.log" | tail -40
timeout 200 "$bin/flashgqa_cuda_bench" --all-tiles --csv "$out/bench.csv" > "$out/bench.log" 2>&1 || status=1
cat "$out/bench.log"
if [ "${CUDA_PEER:-1}" != 0 ]; then
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/cuda_sdpa_peer.py > "$out/peer.log" 2>&1 || status=1
  grep -v "Warning\|call = lambda" "$out/peer.log"
fi
# CUDA_NCU=1: Nsight Compute's view of the default H = 128 kernel on the first target workload
# (where its warps stall, the pipes' utilisation); the clocks left as they are.
if [ "${CUDA_NCU:-0}" != 0 ]; then
  timeout 120 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:flash_forward_kernel<128, 2, 64>" \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section InstructionStats \
    "$bin/flashgqa_cuda_bench" --all-tiles --reps 3 > "$out/ncu.txt" 2>&1 || status=1
  grep -v "^flash\|^gemm\|^device" "$out/ncu.txt" | tail -120
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$out/smi.csv" 2>&1
# Out-of-bounds accesses and shared-memory races, on the test's cases.
timeout 120 compute-sanitizer --tool memcheck "$bin/flashgqa_cuda_test" > "$out/memcheck.log" 2>&1 || status=1
tail -3 "$out/memcheck.log"
timeout 120 compute-sanitizer --tool racecheck "$bin/flashgqa_cuda_test" > "$out/racecheck.log" 2>&1 || status=1
tail -3 "$out/racecheck.log"
exit $status
