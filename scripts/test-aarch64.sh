#!/usr/bin/env bash
# Cross-builds flashgqa's C++ suite for aarch64 with Debian's g++-aarch64-linux-gnu and runs it under
# qemu-user (scripts/test.sh calls this; also on its own: scripts/test-aarch64.sh). No ARM machine is
# needed: the point is that the project builds for aarch64 and that every aarch64 path and rung is
# right there, not how fast it is (emulation is 10-50x slower than native).
#
# What runs (a documented subset: emulation is ~5-20x slower than native, and the whole suite on
# three aarch64 paths takes over an hour here):
#   qemu-aarch64 -cpu max (FEAT_BF16), default path neon-bf16: $main below, the per-path suites
#     (AllIsas/*) on the two NEON sets (neon-bf16 and neon; the others skip, x86 ones included,
#     printing the reason): every micro-kernel against its scalar model, every rung, the packed flash
#     path on awkward shapes, causal offsets, masked rows, NaN, empty inputs, large logits, KV splits
#     and decode, the softcap, the backward, sinks; the decode kernels against their scalar model
#     (DecodeKernels.*) and through the decode path and the KV-cache API on neon-bf16, guarded caches
#     included (src/api/kvcache_guard_test.cpp);
#   -cpu max with FLASHGQA_ISA=neon, then FLASHGQA_ISA=portable: $active, the tests that run on the
#     active path only, so each aarch64 path is forced in turn (the portable set's per-path suites run
#     on every x86 run: the same C++);
#   -cpu neoverse-n1 (no BF16: neon-bf16 skips, neon is the best path): the kernels and flash paths;
#   the CLI end to end (src/cli/cli_test.sh) under -cpu max: every rung with --check on each path,
#     roofline (the NEON ceiling loops), bench and tune.
# Each suite runs as one GoogleTest shard per core (run_suite). Cost on the 2-core CI machine
# (2026-12-02, an Intel Xeon): GoogleTest and the cross build ~5 min, the -cpu max suite 5.7 min
# unsharded with the portable set, 3 min sharded without it, the CLI 45 s, plus the apt-get of the
# cross compiler and qemu-user once.
# Left out (they run on every x86 CI run, on the same portable policy code): the thread-count
# bit-identity tests (KvCacheTest.SameBitsDensePagedAndAnyThreads too: ~1 min on neon-bf16), the
# attention() property test, the packed-sequence and window sweeps, and FlashDecode/KvCacheTest on neon and
# portable (they take the packed path there).
# GoogleTest for the target is built from Debian's libgtest-dev sources (/usr/src/googletest); Google
# Benchmark is not cross-built (flashgqa_bench is skipped here, as CMakeLists.txt does without it).
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHGQA_CROSS=1 scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # shards side by side: see scripts/test.sh
# The decode kernels' scalar-model tests sweep 29 key counts instead of 70 under the emulator: every n
# mod 16 and the counts around 32, 48 and 64 keys (src/kernels/decode_kernels_test.cpp, key_counts).
export FLASHGQA_TEST_EMULATED=1
dir=build-aarch64
toolchain=$PWD/cmake/aarch64-linux-gnu.cmake
start=$SECONDS

if [ ! -f "$dir/googletest-install/lib/cmake/GTest/GTestConfig.cmake" ]; then
  cmake -S /usr/src/googletest -B "$dir/googletest" -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$PWD/$dir/googletest-install" >/dev/null
  cmake --build "$dir/googletest" -j "$jobs" >/dev/null
  cmake --install "$dir/googletest" >/dev/null
fi
cmake -S . -B "$dir/flashgqa" -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DCMAKE_BUILD_TYPE=Release \
  -DGTest_DIR="$PWD/$dir/googletest-install/lib/cmake/GTest" >/dev/null
cmake --build "$dir/flashgqa" -j "$jobs" --target flashgqa flashgqa_tests
echo "test-aarch64: built in $((SECONDS - start)) s"

qemu=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
tests=$dir/flashgqa/flashgqa_tests
export FLASHGQA_TUNE_CACHE=$PWD/$dir/test-tune-cache.tsv
flash='AllIsas/FlashPacked.MatchesReferenceOnAwkwardShapes/neon*:AllIsas/FlashPacked.CausalAtSeveralOffsets/neon*'
flash+=':AllIsas/FlashPacked.FullyMasked*:AllIsas/FlashPacked.NanInInputs*:AllIsas/FlashPacked.EmptyKeys*'
flash+=':AllIsas/FlashPacked.LargeLogits*:AllIsas/FlashPacked.SplitKvDecode*:AllIsas/FlashDecode.MatchesReference/neon*'
main="Microkernels*:CpuFeatures*:Ceilings*:AllRungs/Ladder.MatchesReferenceOnEveryInstructionSet/*"
main+=":AllRungs/Ladder.FullyMasked*:AllRungs/Ladder.EmptyKeys*:$flash:AllIsas/FlashSoftcap.MatchesReference*/neon*"
main+=":AllIsas/FlashBackward.MatchesReferenceOnAwkwardShapes/neon*:AllIsas/Sinks.FlashPathsWithSplitsMatchReference/neon*"
main+=":LinearAttention.SubnormalInputsPassOnEveryInstructionSet"
# The decode kernels (neon-bf16 is the only aarch64 set with them): against their scalar model, then
# through the decode path and the KV-cache API on neon-bf16 only (neon and portable take the packed
# path there, the policy code every x86 run tests).
main+=":DecodeKernels.*:AllIsas/FlashDecode.*/neon_bf16:AllIsas/KvCacheTest.MatchesReference/neon_bf16"
main+=":AllIsas/KvCacheTest.VariantsMatchReference/neon_bf16:AllIsas/KvCacheTest.Int8*/neon_bf16:QuantizeKv*"
# Guarded caches (every page before an inaccessible page): the neon-bf16 decode kernels read no row past
# a page (~45 s emulated, one test: in one shard).
main+=":AllIsas/KvCacheGuardTest.*/neon_bf16"
# The KV-cache API's property test (hostile tables, lengths and k_new; guarded memory) on neon-bf16.
main+=":AllIsas/KvCacheProperty.*/neon_bf16"
active='SoftcapLadder*:SoftcapOption*:KvSplits*:FlashBlocks*:Interrupt*:SinksReference*:PackedSequences.ReferenceEquals*'

# One emulated process keeps one core busy: the suite runs as $jobs GoogleTest shards side by side
# (GTEST_TOTAL_SHARDS), each shard's output printed when all are done; any failing shard fails the run.
run_suite() {  # run_suite CPU ISA FILTER
  local t0=$SECONDS i failed=0 pids=()
  echo "test-aarch64: -cpu $1, FLASHGQA_ISA=$2, --gtest_filter=$3, $jobs shards"
  for ((i = 0; i < jobs; i++)); do
    FLASHGQA_ISA=$2 GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$i "${qemu[@]}" -cpu "$1" "$tests" \
      --gtest_filter="$3" >"$dir/shard-$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < jobs; i++)); do
    wait "${pids[$i]}" || failed=1
    cat "$dir/shard-$i.log"
  done
  echo "test-aarch64: -cpu $1 $2: $((SECONDS - t0)) s"
  return "$failed"
}

run_suite max neon-bf16 "$main"
run_suite max neon "$active"
run_suite max portable "$active"
run_suite neoverse-n1 neon "Microkernels*:CpuFeatures*:AllIsas/FlashPacked.MatchesReferenceOnAwkwardShapes/*"

# The command-line tool end to end, under qemu -cpu max (its default path: neon-bf16).
wrapper=$PWD/$dir/flashgqa-qemu
printf '#!/bin/sh\nexec %s -cpu max %s "$@"\n' "${qemu[*]}" "$PWD/$dir/flashgqa/flashgqa" >"$wrapper"
chmod +x "$wrapper"
t0=$SECONDS
FLASHGQA=$wrapper bash src/cli/cli_test.sh
echo "test-aarch64: cli_test.sh: $((SECONDS - t0)) s; all: $((SECONDS - start)) s"
