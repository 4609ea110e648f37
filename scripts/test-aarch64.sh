#!/usr/bin/env bash
# Cross-builds flashgqa's C++ suite for aarch64 with Debian's g++-aarch64-linux-gnu and runs it under
# qemu-user (scripts/test.sh calls this; also on its own: scripts/test-aarch64.sh). No ARM machine is
# needed: the point is that the project builds for aarch64 and that every aarch64 path and rung is
# right there, not how fast it is (emulation is 10-50x slower than native).
#
# What runs (the documented subset; kAllIsas tests skip, with the reason, the x86 paths under qemu):
#   qemu-aarch64 -cpu max            FLASHGQA_ISA=neon, then FLASHGQA_ISA=portable: every test except
#                                    the slow ones listed in $slow below (each run prints its filter);
#   qemu-aarch64 -cpu neoverse-n1    the best path an N1 has (neon), the kernels and the flash paths;
#   the CLI end to end (src/cli/cli_test.sh) under -cpu max: every rung with --check, roofline, bench.
# The library's own AArch64 paths are chosen at run time (HWCAP), so the -cpu model decides what is
# supported and FLASHGQA_ISA forces each in turn.
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
# Too slow under emulation for every configuration; they run on every x86 CI run, and the aarch64
# paths they would add are covered by the same kernels in the suites that do run.
slow='PropertyTest*:*Threads*:*Fuzz*'

run_suite() {  # run_suite CPU ISA FILTER
  local t0=$SECONDS
  echo "test-aarch64: -cpu $1, FLASHGQA_ISA=$2, --gtest_filter=$3"
  FLASHGQA_ISA=$2 "${qemu[@]}" -cpu "$1" "$tests" --gtest_brief=1 --gtest_filter="$3"
  echo "test-aarch64: -cpu $1 $2: $((SECONDS - t0)) s"
}

run_suite max neon "*:-$slow"
run_suite max portable "*:-$slow"
run_suite neoverse-n1 neon "*Microkernel*:*Flash*:*Ladder*:CpuFeatures*"

# The command-line tool end to end, under qemu -cpu max (its default path: neon).
wrapper=$PWD/$dir/flashgqa-qemu
printf '#!/bin/sh\nexec %s -cpu max %s "$@"\n' "${qemu[*]}" "$PWD/$dir/flashgqa/flashgqa" >"$wrapper"
chmod +x "$wrapper"
t0=$SECONDS
FLASHGQA=$wrapper bash src/cli/cli_test.sh
echo "test-aarch64: cli_test.sh: $((SECONDS - t0)) s; all: $((SECONDS - start)) s"
