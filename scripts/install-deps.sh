#!/usr/bin/env bash
# Installs what flashgqa needs to build and test, on a fresh Debian machine: a C++20 compiler with
# OpenMP, CMake, GoogleTest, Google Benchmark, strace (the tests that a library call opens no
# file) and ccache; clang and libomp-dev too under FLASHGQA_SANITIZE=thread or FLASHGQA_FUZZ=1. Does nothing for what is already there.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
dpkg -s libgtest-dev >/dev/null 2>&1 || need+=(libgtest-dev)
dpkg -s libbenchmark-dev >/dev/null 2>&1 || need+=(libbenchmark-dev)
command -v strace >/dev/null 2>&1 || need+=(strace)
command -v ccache >/dev/null 2>&1 || need+=(ccache)  # scripts/test.sh's builds share their objects
# ThreadSanitizer builds and the fuzzer (scripts/fuzz.sh sets FLASHGQA_FUZZ=1) use clang with LLVM's OpenMP.
if [ "${FLASHGQA_SANITIZE:-0}" = thread ] || [ "${FLASHGQA_FUZZ:-0}" = 1 ]; then
  command -v clang++ >/dev/null 2>&1 || need+=(clang)
  dpkg -s libomp-dev >/dev/null 2>&1 || need+=(libomp-dev)
fi
# The aarch64 cross build under qemu (scripts/test-aarch64.sh sets FLASHGQA_CROSS=1): Debian's cross
# compiler (with its libgomp) and qemu-user; GoogleTest's sources come with libgtest-dev above.
if [ "${FLASHGQA_CROSS:-0}" = 1 ]; then
  command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
  command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
fi
if ((${#need[@]})); then
  echo "install-deps: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
