#!/usr/bin/env bash
# Cross-builds flashgqa's C++ suite for aarch64 with Debian's g++-aarch64-linux-gnu and runs it under
# qemu-user (scripts/test.sh calls this; also on its own: scripts/test-aarch64.sh). No ARM machine is
# needed: the point is that the project builds for aarch64 and that every aarch64 path and rung is
# right there, not how fast it is (emulation is 10-50x slower than native).
#
# What runs (a documented subset: emulation is ~5-20x slower than native, and the whole suite on
# three aarch64 paths takes over an hour here). The per-path suites (AllIsas/*, the ladder, the kernel
# and sinks tests) run every path the emulated CPU supports and skip the others, x86 ones included,
# printing the reason:
#   qemu-aarch64 -cpu max (FEAT_BF16: portable, neon and neon-bf16 all run), default path neon-bf16:
#     $main below: every micro-kernel against its scalar model, every rung, the packed flash path on
#     awkward shapes, causal offsets, masked rows, NaN, empty inputs, large logits, KV splits and
#     decode, the softcap, the backward, sinks; the decode kernels against their scalar model
#     (DecodeKernels.*) and through the decode path and the KV-cache API on neon-bf16;
#   -cpu max with FLASHGQA_ISA=neon, then FLASHGQA_ISA=portable: $active, the tests that run on the
#     active path only, so each aarch64 path is forced in turn;
#   -cpu neoverse-n1 (no BF16: neon-bf16 skips, neon is the best path): the kernels and flash paths;
#   the CLI end to end (src/cli/cli_test.sh) under -cpu max: every rung with --check on each path,
#     roofline (the NEON ceiling loops), bench and tune.
# Cost on the 2-core CI machine, measured from nothing: GoogleTest and the cross build 2.7 min, the
# emulated runs 4.3 min (7.0 min in all), plus the apt-get of the cross compiler and qemu-user once.
# The decode suites add ~1.5 min to the -cpu max run (measured alone on 2026-12-01 at load ~3:
# DecodeKernels 17-21 s, FlashDecode/neon_bf16 25 s, KvCacheTest/neon_bf16 21 s before the int8
# cases, which add ~18 s); a whole run with them (before the int8 cases) took 209 s for that step and
# 4.1 min emulated in all (incremental build, busy machine).
# Left out (they run on every x86 CI run, on the same portable policy code): the thread-count
# bit-identity tests (KvCacheTest.SameBitsDensePagedAndAnyThreads too: ~1 min on neon-bf16), the
# property test, the packed-sequence and window sweeps, and FlashDecode/KvCacheTest on neon and
# portable (they take the packed path there).
# GoogleTest for the target is built from Debian's libgtest-dev sources (/usr/src/googletest); Google
# Benchmark is not cross-built (flashgqa_bench is skipped here, as CMakeLists.txt does without it).
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHGQA_CROSS=1 scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
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
flash='AllIsas/FlashPacked.MatchesReferenceOnAwkwardShapes/*:AllIsas/FlashPacked.CausalAtSeveralOffsets/*'
flash+=':AllIsas/FlashPacked.FullyMasked*:AllIsas/FlashPacked.NanInInputs*:AllIsas/FlashPacked.EmptyKeys*'
flash+=':AllIsas/FlashPacked.LargeLogits*:AllIsas/FlashPacked.SplitKvDecode*:AllIsas/FlashDecode.MatchesReference/*'
main="Microkernels*:CpuFeatures*:Ceilings*:AllRungs/Ladder.MatchesReferenceOnEveryInstructionSet/*"
main+=":AllRungs/Ladder.FullyMasked*:AllRungs/Ladder.EmptyKeys*:$flash:AllIsas/FlashSoftcap.MatchesReference*"
main+=":AllIsas/FlashBackward.MatchesReferenceOnAwkwardShapes/*:AllIsas/Sinks.FlashPathsWithSplitsMatchReference/*"
main+=":LinearAttention.SubnormalInputsPassOnEveryInstructionSet"
# The decode kernels (neon-bf16 is the only aarch64 set with them): against their scalar model, then
# through the decode path and the KV-cache API on neon-bf16 only (neon and portable take the packed
# path there, the policy code every x86 run tests).
main+=":DecodeKernels.*:AllIsas/FlashDecode.*/neon_bf16:AllIsas/KvCacheTest.MatchesReference/neon_bf16"
main+=":AllIsas/KvCacheTest.VariantsMatchReference/neon_bf16:AllIsas/KvCacheTest.Int8*/neon_bf16:QuantizeKv*"
active='SoftcapLadder*:SoftcapOption*:KvSplits*:FlashBlocks*:Interrupt*:SinksReference*:PackedSequences.ReferenceEquals*'

run_suite() {  # run_suite CPU ISA FILTER
  local t0=$SECONDS
  echo "test-aarch64: -cpu $1, FLASHGQA_ISA=$2, --gtest_filter=$3"
  FLASHGQA_ISA=$2 "${qemu[@]}" -cpu "$1" "$tests" --gtest_filter="$3"
  echo "test-aarch64: -cpu $1 $2: $((SECONDS - t0)) s"
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
