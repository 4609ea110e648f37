#!/usr/bin/env bash
# ctest reads_no_files: runs reads_no_files_test.cpp's program under strace and fails if a library call
# opened any file (open or openat between the program's begin and end markers, in any thread). The
# Python binding has the same test (python/tests/test_reads_no_files.py).
# Usage: PROGRAM=path/to/flashgqa_reads_no_files bash src/api/reads_no_files_test.sh
set -euo pipefail

: "${PROGRAM:?set PROGRAM to the flashgqa_reads_no_files executable}"
command -v strace >/dev/null || { echo "reads_no_files: strace not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
log=$(mktemp "${TMPDIR:-/tmp}/flashgqa_strace.XXXXXX")
trap 'rm -f "$log"' EXIT

# LeakSanitizer cannot run under ptrace: off for the traced run of a sanitized build (the rest of the
# suite checks leaks).
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" strace -f -qq -e trace=open,openat -o "$log" "$PROGRAM"
grep -q 'flashgqa-reads-no-files-begin' "$log" || { echo "reads_no_files: begin marker not traced" >&2; exit 1; }
grep -q 'flashgqa-reads-no-files-end' "$log" || { echo "reads_no_files: end marker not traced" >&2; exit 1; }
opened=$(awk '/flashgqa-reads-no-files-end/ { inside = 0 }
              inside && /open(at)?\(/ { print }
              /flashgqa-reads-no-files-begin/ { inside = 1 }' "$log")
# LLVM's OpenMP runtime (the ThreadSanitizer build links it; the default build uses libgomp, which opens
# nothing) starts on the first parallel region and looks for its own plug-ins, message catalogs and
# registration file: those opens are the runtime's, named here one by one, never a path of ours.
if ldd "$PROGRAM" 2>/dev/null | grep -q 'libomp\.so'; then
  opened=$(grep -Ev 'libmemkind\.so|libarcher\.so|/etc/ld\.so\.cache|/libomp\.cat"|/dev/shm/__KMP_REGISTERED_LIB_|"/sys/devices/system/cpu/possible"' <<<"$opened" || true)
fi
if [[ -n $opened ]]; then
  echo "reads_no_files: library calls opened files:" >&2
  echo "$opened" >&2
  exit 1
fi
echo "reads_no_files: no file opened by the library calls"
