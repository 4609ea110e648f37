#!/usr/bin/env bash
# Fuzzes the .npy reader with libFuzzer (clang, AddressSanitizer + UBSan) for SECONDS (default 60):
#   scripts/fuzz.sh [SECONDS]
# Builds build-fuzz/npy_fuzz, starts from the seed corpus in src/io/fuzz_corpus (left unchanged; new
# inputs go to build-fuzz/corpus), and fails on any crash, sanitizer report, leak or hang (a crashing
# input is saved as build-fuzz/crash-*; turn it into a regression test in src/io/npy_test.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
FLASHGQA_FUZZ=1 scripts/install-deps.sh  # clang and LLVM's OpenMP besides the usual toolchain
dir=build-fuzz
CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHGQA_FUZZ=ON -DFLASHGQA_SANITIZE=ON \
  -DFLASHGQA_BUILD_TESTS=OFF >/dev/null
cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 2)" --target npy_fuzz
mkdir -p "$dir/corpus"
cd "$dir"
# -timeout: one input taking over 10 s is a hang; -rss_limit_mb: a parse may not allocate without bound.
./npy_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  corpus ../src/io/fuzz_corpus
