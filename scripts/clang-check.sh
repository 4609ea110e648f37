#!/usr/bin/env bash
# Checks that every source this machine's build compiles (library, tools, tests, benchmarks) is also
# valid C++20 for clang, the compiler of the ThreadSanitizer build (FLASHGQA_SANITIZE=thread
# scripts/test.sh) and the fuzzer (scripts/fuzz.sh): each file's own compile command from CMake, with
# -fsyntax-only (clang's parse and semantic checks, no code generation: ~1 minute on 2 cores). GCC
# accepts some things clang rejects, e.g. a lambda capturing a structured binding (clang 16+ only),
# which kept the TSan build from compiling from session 14 until session 40.
#   scripts/clang-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHGQA_FUZZ=1 scripts/install-deps.sh  # clang and LLVM's OpenMP
dir=build-clang-check
CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
python3 - "$dir/compile_commands.json" "$(nproc 2>/dev/null || echo 2)" <<'PY'
import concurrent.futures, json, shlex, subprocess, sys

commands = json.load(open(sys.argv[1]))


def check(entry):
    args, skip = [], False
    for a in shlex.split(entry["command"]):  # the compile command without its object output
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c":
            args.append(a)
    r = subprocess.run(args + ["-fsyntax-only"], cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], r.returncode, r.stderr


with concurrent.futures.ThreadPoolExecutor(int(sys.argv[2])) as pool:
    results = list(pool.map(check, commands))
failed = [(f, err) for f, rc, err in results if rc != 0]
for f, err in failed:
    print(f"clang-check: {f} does not compile with clang:\n{err}", file=sys.stderr)
print(f"clang-check: {len(results) - len(failed)} of {len(results)} sources compile with clang", file=sys.stderr)
sys.exit(1 if failed or not results else 0)
PY
