#!/usr/bin/env bash
# Builds flashgqa (Release) and runs every test through ctest, builds and runs examples/cpp against the
# installed package, the C++ suite cross-built for aarch64 under qemu (scripts/test-aarch64.sh), then
# the Python package's tests.
#   FLASHGQA_SANITIZE=1 scripts/test.sh        builds in build-asan with AddressSanitizer + UBSan instead.
#   FLASHGQA_SANITIZE=thread scripts/test.sh   builds in build-tsan with ThreadSanitizer instead: clang
#     with LLVM's OpenMP runtime (libomp), which is not instrumented; TSan's
#     ignore_noninstrumented_modules=1 (the runtime's own recommendation) keeps its internal memsets
#     and frees from being reported as races, and every access of flashgqa's own code is still checked.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
# ctest runs $jobs test processes at once, each with its own OpenMP team: threads that spin while they
# wait (libgomp's default) take the cores the other process needs, which made the suite 2.2x slower
# on 2 cores (one test 35x). Passive waiting changes no result, only the time; set it to override.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# ccache (installed by install-deps.sh) under every build this script configures, its cache in this
# checkout (build-ccache, git-ignored), so a fresh clone starts cold: the Python wheel's build below
# then takes the Release build's objects instead of compiling the library again (the same compiler
# and flags; ccache hashes the compiler's name too, and scikit-build-core names g++, Python's CXX,
# where CMake alone picks c++: hence CXX). CMake reads both variables when a build folder is first
# configured.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache} CCACHE_DIR=${CCACHE_DIR:-$PWD/build-ccache}
  export CXX=${CXX:-g++}
fi
sanitizer_flags=()
if [ "${FLASHGQA_SANITIZE:-0}" = 1 ]; then
  dir=build-asan
  # -g1 (line tables: the reports' file:line stacks) instead of -g: the build's compile time 0.63-0.75x
  # per file (no variable info; for a debugger, build with -g).
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DFLASHGQA_SANITIZE=ON >/dev/null
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  sanitizer_flags=(-fsanitize=address,undefined)
elif [ "${FLASHGQA_SANITIZE:-0}" = thread ]; then
  dir=build-tsan
  CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHGQA_TSAN=ON >/dev/null
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1"
  sanitizer_flags=(-fsanitize=thread)
else
  dir=build
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$dir" -j "$jobs"
ctest --test-dir "$dir" --output-on-failure -j "$jobs"

# The installed C++ package (examples/cpp): install into a prefix inside the build folder, then build
# and run the example project against it, as another project would use it (find_package).
prefix=$dir/install-test
rm -rf "$prefix" "$dir/example"
cmake --install "$dir" --prefix "$prefix" >/dev/null
example_flags=()
if ((${#sanitizer_flags[@]})); then  # the installed library is instrumented: so is its user
  example_flags=(-DCMAKE_CXX_FLAGS="${sanitizer_flags[*]}" -DCMAKE_EXE_LINKER_FLAGS="${sanitizer_flags[*]}")
fi
example_cxx=()
[ "${FLASHGQA_SANITIZE:-0}" = thread ] && example_cxx=(-DCMAKE_CXX_COMPILER=clang++)
cmake -S examples/cpp -B "$dir/example" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/$prefix" \
  "${example_cxx[@]}" "${example_flags[@]}" >/dev/null
cmake --build "$dir/example" -j "$jobs"
"$dir/example/flashgqa_example"

# The same C++ suite built for aarch64 and run under qemu (scripts/test-aarch64.sh; a documented
# subset, every aarch64 path forced in turn; about 9 minutes on 2 cores, the cross build included).
# Not under the sanitizers (one emulated run is enough); FLASHGQA_AARCH64=0 skips it.
if [ "${FLASHGQA_SANITIZE:-0}" = 0 ] && [ "${FLASHGQA_AARCH64:-1}" = 1 ]; then
  scripts/test-aarch64.sh
fi

# The Python package (python/README.md): install it from this tree and run its tests. Skipped under
# the sanitizers (a sanitized library cannot be loaded into an uninstrumented Python). torch is
# installed too (PyPI's wheel, with its CUDA libraries: about a minute and 5 GB the first time), so
# its tests (SDPA, torch tensors, devices) run instead of skipping.
if [ "${FLASHGQA_SANITIZE:-0}" = 0 ]; then
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  python3 -c "import numpy, ml_dtypes, jax, torch, pytest, scikit_build_core, nanobind" 2>/dev/null ||
    python3 -m pip install -q numpy ml_dtypes "jax[cpu]" torch pytest scikit-build-core nanobind
  # No build isolation and a kept build folder: later runs rebuild only what changed.
  python3 -m pip install -q --no-build-isolation -Cbuild-dir=build-python ./
  FLASHGQA_NO_SKIPS=1 python3 -m pytest -q -rs python/tests
fi
