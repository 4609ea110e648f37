#!/usr/bin/env bash
# End-to-end test of the flashgqa command-line tool (ctest: cli_end_to_end). Makes random inputs with
# `flashgqa random`, runs `flashgqa attention` with every algorithm and flag, checks results against
# the float64 reference (--check), the --repeat timing line, 4-D q with --kv-heads, and that every
# error exits non-zero with exactly one line on stderr. Needs only bash and coreutils.
# Usage: FLASHGQA=path/to/flashgqa bash src/cli/cli_test.sh
set -euo pipefail

: "${FLASHGQA:?set FLASHGQA to the flashgqa executable}"
work=$(mktemp -d "${TMPDIR:-/tmp}/flashgqa_cli.XXXXXX")
trap 'rm -rf "$work"' EXIT
out=$work/stdout
err=$work/stderr

passed=0
failed=0
fail() {
  failed=$((failed + 1))
  echo "FAIL: $1" >&2
}
pass() { passed=$((passed + 1)); }
line_count() { awk 'END { print NR }' "$1"; }

# expect_ok NAME CMD...: exit 0 and nothing on stderr.
expect_ok() {
  local name=$1
  shift
  if "$@" >"$out" 2>"$err"; then
    if [[ -s $err ]]; then fail "$name: unexpected stderr: $(cat "$err")"; else pass; fi
  else
    fail "$name: exit $? ($(cat "$err"))"
  fi
}

# expect_check NAME CMD...: exit 0, nothing on stderr, and one 'check: ...: ok' line on stdout.
expect_check() {
  local name=$1
  shift
  expect_ok "$name" "$@"
  if [[ $(line_count "$out") -ne 1 ]] || ! grep -Eq '^check: max \|err\| .*: ok$' "$out"; then
    fail "$name: expected one 'check: ... ok' line on stdout, got: $(cat "$out")"
  else
    pass
  fi
}

# expect_error NAME NEEDLE CMD...: non-zero exit, exactly one stderr line, containing NEEDLE.
expect_error() {
  local name=$1 needle=$2
  shift 2
  if "$@" >"$out" 2>"$err"; then
    fail "$name: exit 0, expected an error"
    return
  fi
  local lines
  lines=$(line_count "$err")
  if [[ $lines -ne 1 ]]; then
    fail "$name: $lines stderr lines, expected 1: $(cat "$err")"
  elif ! grep -qF -- "$needle" "$err"; then
    fail "$name: stderr '$(cat "$err")' does not contain '$needle'"
  else
    pass
  fi
}

# expect_header NAME FILE TEXT: the .npy header of FILE contains TEXT (e.g. "'shape': (1, 2)").
expect_header() {
  if head -c 128 "$2" | grep -aqF -- "$3"; then pass; else fail "$1: header of $2 lacks $3"; fi
}

run=("$FLASHGQA")
shape=1,2,3,37,53,64

# --- help ---------------------------------------------------------------------------------------
expect_ok "help" "${run[@]}" --help
for flag in --q --k --v --out --lse --algo --causal --causal-offset --window --scale --precision --threads \
  --block-q --block-kv --repeat --kv-heads --check --shape --dtype --seed --scale-inputs --dir --softcap; do
  if grep -qF -- "$flag" "$out"; then pass; else fail "flashgqa --help does not document $flag"; fi
done
expect_ok "attention help" "${run[@]}" attention --help
if grep -qF -- "--causal-offset" "$out"; then pass; else fail "attention --help lacks --causal-offset"; fi
expect_ok "random help" "${run[@]}" random --help

# --- random -------------------------------------------------------------------------------------
for dtype in bfloat16 float32 float16; do
  expect_ok "random $dtype" "${run[@]}" random --shape "$shape" --dtype "$dtype" --seed 1 --dir "$work/$dtype"
done
expect_header "random q shape" "$work/bfloat16/q.npy" "'shape': (1, 2, 3, 37, 64)"
expect_header "random k shape" "$work/bfloat16/k.npy" "'shape': (1, 2, 53, 64)"
expect_header "random bf16 descr" "$work/bfloat16/v.npy" "'descr': '<V2'"
expect_header "random f32 descr" "$work/float32/v.npy" "'descr': '<f4'"
expect_header "random f16 descr" "$work/float16/v.npy" "'descr': '<f2'"
expect_ok "random again" "${run[@]}" random --shape "$shape" --dtype bfloat16 --seed 1 --dir "$work/again"
expect_ok "random other seed" "${run[@]}" random --shape "$shape" --dtype bfloat16 --seed 2 --dir "$work/seed2"
if cmp -s "$work/bfloat16/q.npy" "$work/again/q.npy" && cmp -s "$work/bfloat16/v.npy" "$work/again/v.npy"; then
  pass
else
  fail "random is not deterministic for a seed"
fi
if cmp -s "$work/bfloat16/q.npy" "$work/seed2/q.npy"; then fail "seeds 1 and 2 give the same q"; else pass; fi
expect_ok "random scaled" "${run[@]}" random --shape "$shape" --dtype float32 --scale-inputs 30 --dir "$work/big"
expect_ok "random empty T" "${run[@]}" random --shape 1,1,1,0,5,8 --dtype float32 --dir "$work/emptyT"

# Subnormal inputs (~1e-40): the amx, avx512bf16 and neon-bf16 kernels flush them to zero; --check's bound allows that
# (reference/tolerance.hpp, underflow) on every instruction-set path this machine supports.
expect_ok "random subnormal" "${run[@]}" random --shape 1,2,2,5,70,64 --dtype float32 --scale-inputs 1e-40 --dir "$work/subnormal"
sub=(--q "$work/subnormal/q.npy" --k "$work/subnormal/k.npy" --v "$work/subnormal/v.npy")
for isa in amx avx512bf16 avx512f avx2 neon-bf16 neon portable; do
  "${run[@]}" attention "${sub[@]}" --out "$work/subnormal/o.npy" --isa "$isa" >/dev/null 2>&1 || continue  # not here
  for algo in naive chunked-unstable chunked kernel1 flash; do
    expect_check "subnormal $isa $algo" "${run[@]}" attention "${sub[@]}" --out "$work/subnormal/o.npy" --isa "$isa" --algo "$algo" --check
  done
done

# --- attention: every algorithm, every dtype, checked against the reference ----------------------
for dtype in bfloat16 float32 float16; do
  d=$work/$dtype
  inputs=(--q "$d/q.npy" --k "$d/k.npy" --v "$d/v.npy")
  for algo in naive chunked-unstable chunked kernel1 flash; do
    expect_check "$algo $dtype" "${run[@]}" attention "${inputs[@]}" --out "$d/o_$algo.npy" --algo "$algo" --check
  done
  expect_header "out dtype $dtype" "$d/o_flash.npy" "$(head -c 128 "$d/q.npy" | grep -ao "'descr': '[^']*'")"
  expect_header "out shape $dtype" "$d/o_flash.npy" "'shape': (1, 2, 3, 37, 64)"
done
d=$work/bfloat16
inputs=(--q "$d/q.npy" --k "$d/k.npy" --v "$d/v.npy")
expect_ok "default algo" "${run[@]}" attention "${inputs[@]}" --out "$d/o_default.npy"
if cmp -s "$d/o_default.npy" "$d/o_flash.npy"; then pass; else fail "the default algorithm is not flash"; fi
expect_check "causal" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --causal --check
expect_check "causal offset" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --causal --causal-offset 5 --check
expect_check "causal offset negative" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --causal --causal-offset -3 --check
expect_check "window" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --window 5,3 --check
expect_check "causal window" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --causal --window 9,-1 --check
expect_check "window offset" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --window -1,4 --causal-offset 0 --algo naive --check
expect_check "lse" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --lse "$d/lse.npy" --check
expect_header "lse shape" "$d/lse.npy" "'shape': (1, 2, 3, 37)"
expect_header "lse dtype" "$d/lse.npy" "'descr': '<f4'"
expect_check "f32 precision" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --precision f32 --scale 0.2 --check
expect_check "blocks" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --algo kernel1 --block-q 5 --block-kv 7 --threads 1 --check
expect_check "flash blocks" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --block-q 16 --block-kv 16 --threads 2 --check
expect_check "chunked block" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --algo chunked --block-kv 10 --check
expect_check "softcap" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --softcap 0.5 --causal --check
expect_check "softcap naive" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --softcap 2 --algo naive --check
expect_error "bad softcap" "softcap: -1" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --softcap -1
expect_ok "empty T" "${run[@]}" attention --q "$work/emptyT/q.npy" --k "$work/emptyT/k.npy" --v "$work/emptyT/v.npy" --out "$work/emptyT/o.npy"
expect_header "empty T out" "$work/emptyT/o.npy" "'shape': (1, 1, 1, 0, 8)"

# --- --repeat ------------------------------------------------------------------------------------
if "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --repeat 3 >"$out" 2>"$err"; then
  if [[ $(line_count "$err") -eq 1 ]] &&
    grep -Eq '^flash: median [0-9.]+ ms over 3 runs, [0-9.]+ GFLOP/s$' "$err"; then
    pass
  else
    fail "--repeat 3: stderr '$(cat "$err")' does not match the timing line"
  fi
else
  fail "--repeat 3: exit $? ($(cat "$err"))"
fi
if "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --algo naive --causal --repeat 2 2>"$err" >/dev/null &&
  grep -Eq '^naive: median [0-9.]+ ms over 2 runs, [0-9.]+ GFLOP/s$' "$err"; then
  pass
else
  fail "--algo naive --repeat 2: stderr '$(cat "$err")'"
fi

# --- 4-D q [B,K*G,T,H] with --kv-heads: the same bytes as the 5-D q, relabelled ---------------------
q5=$d/q.npy
q4=$d/q4.npy
header_len=118 # the writer's v1 header for these shapes: 10 + 118 = 128 bytes before the data
{
  head -c 10 "$q5" &&
    printf "%-$((header_len - 1))s\n" "{'descr': '<V2', 'fortran_order': False, 'shape': (1, 6, 37, 64), }" &&
    tail -c +129 "$q5"
} >"$q4" 2>/dev/null || fail "cannot build the 4-D q from $q5"
expect_check "4-D q" "${run[@]}" attention --q "$q4" --k "$d/k.npy" --v "$d/v.npy" --kv-heads 2 --out "$d/o4.npy" --lse "$d/lse4.npy" --check
expect_header "4-D out shape" "$d/o4.npy" "'shape': (1, 6, 37, 64)"
expect_header "4-D lse shape" "$d/lse4.npy" "'shape': (1, 6, 37)"
if cmp -s <(tail -c +129 "$d/o4.npy") <(tail -c +129 "$d/o_flash.npy"); then pass; else fail "4-D q output differs from 5-D"; fi
expect_ok "5-D q with matching --kv-heads" "${run[@]}" attention "${inputs[@]}" --kv-heads 2 --out "$d/o.npy"

# --- errors: non-zero exit, one line on stderr ------------------------------------------------------
all=("${inputs[@]}" --out "$d/o.npy")
expect_error "no command" "missing command" "${run[@]}"
expect_error "unknown command" "unknown command 'frobnicate'" "${run[@]}" frobnicate
expect_error "missing file" "nope.npy" "${run[@]}" attention --q "$work/nope.npy" --k "$d/k.npy" --v "$d/v.npy" --out "$d/o.npy"
echo "not a numpy file" >"$work/garbage.npy"
expect_error "garbage file" "magic string" "${run[@]}" attention --q "$work/garbage.npy" --k "$d/k.npy" --v "$d/v.npy" --out "$d/o.npy"
expect_error "unknown flag" "unknown flag '--bogus'" "${run[@]}" attention "${all[@]}" --bogus
expect_error "missing required flag" "missing required flag --out" "${run[@]}" attention "${inputs[@]}"
expect_error "missing value" "--threads is missing its value" "${run[@]}" attention "${all[@]}" --threads
expect_error "missing value before flag" "--scale is missing its value" "${run[@]}" attention --scale --causal "${all[@]}"
expect_error "non-numeric" "'abc' is not an integer" "${run[@]}" attention "${all[@]}" --threads abc
expect_error "trailing junk" "'4x' is not an integer" "${run[@]}" attention "${all[@]}" --block-kv 4x
expect_error "overflow" "out of range" "${run[@]}" attention "${all[@]}" --causal --causal-offset 99999999999999999999
expect_error "out of range" "out of range" "${run[@]}" attention "${all[@]}" --repeat 0
expect_error "negative threads" "out of range" "${run[@]}" attention "${all[@]}" --threads -2
expect_error "bad scale" "not a number" "${run[@]}" attention "${all[@]}" --scale 0.5.5
expect_error "infinite scale" "finite" "${run[@]}" attention "${all[@]}" --scale inf
expect_error "unknown algo" "unknown algorithm 'fast'" "${run[@]}" attention "${all[@]}" --algo fast
expect_error "unknown precision" "unknown precision" "${run[@]}" attention "${all[@]}" --precision f16
expect_error "offset without causal" "--causal-offset needs --causal or --window" "${run[@]}" attention "${all[@]}" --causal-offset 3
expect_error "window of one number" "--window" "${run[@]}" attention "${all[@]}" --window 5
expect_error "window below -1" "--window" "${run[@]}" attention "${all[@]}" --window 5,-2
expect_error "flag twice" "given twice" "${run[@]}" attention "${all[@]}" --algo naive --algo flash
expect_error "stray argument" "unexpected argument" "${run[@]}" attention "${all[@]}" stray
expect_error "naive blocks" "naive takes no blocks" "${run[@]}" attention "${all[@]}" --algo naive --block-q 4
expect_ok "random H=32" "${run[@]}" random --shape 1,2,3,37,53,32 --dir "$work/h32"
expect_error "mismatched k" "k: shape" "${run[@]}" attention --q "$d/q.npy" --k "$work/h32/k.npy" --v "$d/v.npy" --out "$d/o.npy"
expect_error "mismatched v" "v: shape" "${run[@]}" attention --q "$d/q.npy" --k "$d/k.npy" --v "$work/h32/v.npy" --out "$d/o.npy"
expect_error "k rank" "expected rank 4" "${run[@]}" attention --q "$d/q.npy" --k "$d/q.npy" --v "$d/v.npy" --out "$d/o.npy"
expect_error "4-D q without --kv-heads" "--kv-heads" "${run[@]}" attention --q "$q4" --k "$d/k.npy" --v "$d/v.npy" --out "$d/o.npy"
expect_error "--kv-heads not dividing" "expected a multiple of K = 4 kv heads (K from --kv-heads)" "${run[@]}" attention --q "$q4" --k "$d/k.npy" --v "$d/v.npy" --out "$d/o.npy" --kv-heads 4
expect_error "--kv-heads mismatch" "does not match" "${run[@]}" attention "${all[@]}" --kv-heads 3
expect_error "unwritable out" "cannot open for writing" "${run[@]}" attention "${inputs[@]}" --out "$work/no/such/dir/o.npy"
expect_error "random bad shape" "expected 6" "${run[@]}" random --shape 1,2,3 --dir "$work/x"
expect_error "random bad dtype" "unknown dtype 'float64'" "${run[@]}" random --shape "$shape" --dtype float64 --dir "$work/x"
expect_error "random huge shape" "64 bits" "${run[@]}" random --shape 4294967296,4294967296,2,1,1,1 --dir "$work/x"
expect_error "random missing dir" "missing required flag --dir" "${run[@]}" random --shape "$shape"
# chunked-unstable overflows on large logits: --check must fail (and still say so on stdout).
b=$work/big
expect_error "check fails" "--check" "${run[@]}" attention --q "$b/q.npy" --k "$b/k.npy" --v "$b/v.npy" --out "$b/o.npy" --algo chunked-unstable --check
if grep -Eq '^check: .*: FAILED$' "$out"; then pass; else fail "failed check: stdout '$(cat "$out")'"; fi
# A softcap bounds the logits (|c tanh(s/c)| < c): chunked-unstable no longer overflows.
expect_check "softcap tames chunked-unstable" "${run[@]}" attention --q "$b/q.npy" --k "$b/k.npy" --v "$b/v.npy" \
  --out "$b/o.npy" --algo chunked-unstable --softcap 30 --check

# The study commands: roofline, bench and tune (tiny sizes; caches kept inside $work).
export XDG_CACHE_HOME=$work/cache FLASHGQA_TUNE_CACHE=$work/cache/tune.tsv
"${run[@]}" roofline --shape 1,2,4,512,512,64 --threads 1 >"$out" 2>"$err" && pass || fail "roofline: $(cat "$err")"
if grep -q "flash is compute-bound from T = S >=" "$out" && grep -q "balance point" "$out"; then pass; else fail "roofline output: $(cat "$out")"; fi
if [[ -s $work/cache/flashgqa/ceilings.tsv ]]; then pass; else fail "roofline did not cache its ceilings"; fi
"${run[@]}" roofline --shape 1,2,4,512,512,64 --threads 1 >"$out" 2>"$err" || true
if grep -q "from the cache" "$out"; then pass; else fail "roofline did not reuse its cache: $(cat "$out")"; fi
if "${run[@]}" bench --out "$work/bench" --seq 32,48 --algos naive,flash-backward --repeats 1 --threads 1 >"$out" 2>"$err"; then
  grep -Eq '^flash-backward +48 ' "$out" && pass || fail "bench: no flash-backward row at T=S=48: $(cat "$out")"
  pass
  for f in bench.csv bench.json bench.svg; do [[ -s $work/bench/$f ]] && pass || fail "bench did not write $f"; done
  [[ $(line_count "$work/bench/bench.csv") -eq 5 ]] && pass || fail "bench.csv: expected a header and 4 rows"
  grep -q '^<svg' "$work/bench/bench.svg" && pass || fail "bench.svg is not an SVG"
  grep -q 'bench: \[4/4\] flash-backward' "$err" && pass || fail "bench progress on stderr: $(cat "$err")"
else
  fail "bench: exit $? ($(cat "$err"))"
fi
# bench --decode: every K/V dtype, dense and paged, a CSV row each with its GB/s and % of the DRAM stream.
if "${run[@]}" bench --decode --shape 2,2,2,1,300,64 --page-sizes 0,16 --repeats 1 --threads 1 --out "$work/bd" >"$out" 2>"$err"; then
  grep -q "DRAM read [0-9.]* GB/s (measured" "$out" && pass || fail "bench --decode header: $(cat "$out")"
  for kvd in bfloat16 float16 float32 int8; do
    grep -Eq "^page16 +$kvd +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$out" && pass || fail "bench --decode: no page16 $kvd row: $(cat "$out")"
  done
  [[ $(line_count "$work/bd/bench_decode.csv") -eq 9 ]] && pass || fail "bench_decode.csv: expected a header and 8 rows"
  grep -q "^dense,0,int8,2,2,2,1,64,300,.*,0$" "$work/bd/bench_decode.csv" && pass || fail "bench_decode.csv: no dense int8 row"
else
  fail "bench --decode: exit $? ($(cat "$err"))"
fi
# --huge-pages: the cache in memory advised MADV_HUGEPAGE, said in the header and the CSV's last column.
if "${run[@]}" bench --decode --huge-pages --shape 2,2,2,1,300,64 --kv-dtypes bfloat16,int8 --page-sizes 16 --repeats 1 \
    --threads 1 --out "$work/bdh" >"$out" 2>"$err"; then
  grep -q "advised MADV_HUGEPAGE (--huge-pages)" "$out" && pass || fail "bench --decode --huge-pages header: $(cat "$out")"
  grep -Eq "^page16 +int8 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$out" && pass || fail "bench --huge-pages: no page16 int8 row: $(cat "$out")"
  grep -q "^page16,16,bfloat16,2,2,2,1,64,300,.*,1$" "$work/bdh/bench_decode.csv" && pass || fail "bench_decode.csv with --huge-pages: $(cat "$work/bdh/bench_decode.csv")"
else
  fail "bench --decode --huge-pages: exit $? ($(cat "$err"))"
fi
expect_error "bench huge pages without decode" "--huge-pages: only with --decode" "${run[@]}" bench --huge-pages
expect_error "bench page size" "expected 0 (dense) or a multiple of 16" "${run[@]}" bench --decode --page-sizes 24
expect_error "bench kv-dtypes without decode" "--kv-dtypes: only with --decode" "${run[@]}" bench --kv-dtypes int8
expect_error "bench decode with seq" "--seq: not used with --decode" "${run[@]}" bench --decode --seq 64
expect_ok "tune" "${run[@]}" tune --shape 1,1,2,40,40,64 --block-q 8,16 --block-kv 16,32 --repeats 1 --threads 1
if grep -q "^best: block_q" "$out" && grep -q "stored in $FLASHGQA_TUNE_CACHE" "$out"; then pass; else fail "tune output: $(cat "$out")"; fi
if head -1 "$FLASHGQA_TUNE_CACHE" | grep -q "flashgqa tune cache v1"; then pass; else fail "tune cache not written"; fi
printf '# flashgqa tune cache v1\ngarbage\n' >"$FLASHGQA_TUNE_CACHE"
"${run[@]}" attention "${all[@]}" --repeat 2 >"$out" 2>"$err" && pass || fail "attention with a corrupt tune cache must still work: $(cat "$err")"
grep -q "warning: tune cache .* corrupt" "$out" && pass || fail "no warning on stdout about the corrupt tune cache: $(cat "$out")"
[[ $(line_count "$err") -eq 1 ]] && grep -Eq '^flash: median [0-9.]+ ms over 2 runs, [0-9.]+ GFLOP/s$' "$err" && pass ||
  fail "--repeat with a corrupt tune cache: expected exactly the timing line on stderr, got: $(cat "$err")"
expect_error "tune without shape" "missing required flag --shape" "${run[@]}" tune
expect_error "bench bad algo" "algorithm" "${run[@]}" bench --algos fast
expect_error "attention bad isa" "isa" "${run[@]}" attention "${all[@]}" --isa sse9
unset XDG_CACHE_HOME FLASHGQA_TUNE_CACHE

# Validation before allocation: a q.npy of [1,1,1,2^28,0] (no data, H = 0) must be rejected before the
# 1 GiB lse is allocated (under a 400 MB address-space limit where the sanitizers allow one).
# npy_f32 PATH SHAPE [BYTES]: a float32 .npy, SHAPE as in "1, 2, 0", its data the printf escapes BYTES
# (little-endian); npy_empty PATH SHAPE: one with no elements (header only).
npy_f32() {
  local dict="{'descr': '<f4', 'fortran_order': False, 'shape': ($2), }"
  local len=$(((10 + ${#dict} + 1 + 63) / 64 * 64 - 10))
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $((len % 256)))\\x$(printf %02x $((len / 256)))";
    printf '%s' "$dict"; printf "%$((len - ${#dict} - 1))s\n" ""; printf "${3:-}"; } >"$1"
}
npy_empty() { npy_f32 "$1" "$2"; }
npy_empty "$work/hq.npy" "1, 1, 1, 268435456, 0"
npy_empty "$work/hk.npy" "1, 1, 5, 0"
huge=(attention --q "$work/hq.npy" --k "$work/hk.npy" --v "$work/hk.npy" --out "$work/ho.npy" --lse "$work/hl.npy")
if [[ -z ${ASAN_OPTIONS:-}${TSAN_OPTIONS:-} ]]; then  # the sanitizers reserve more address space
  expect_error "H = 0 rejected before allocating" "H = 0" bash -c 'ulimit -v 400000 && exec "$@"' _ "${run[@]}" "${huge[@]}"
else
  expect_error "H = 0 rejected before allocating" "H = 0" "${run[@]}" "${huge[@]}"
fi
# Output paths are checked before computing: a bad --lse leaves no --out behind.
rm -f "$work/o_early.npy"
expect_error "bad --lse fails first" "cannot open for writing" "${run[@]}" attention "${inputs[@]}" \
  --out "$work/o_early.npy" --lse "$work/missing/l.npy"
[[ ! -e $work/o_early.npy ]] && pass || fail "bad --lse: --out was written before the error"
expect_error "--out is a folder" "is a directory" "${run[@]}" attention --q "$b/q.npy" --k "$b/k.npy" --v "$b/v.npy" --out "$work"

# --- attention sinks (--sinks): [K,G] or [K*G] float32, one logit per query head (K = 2, G = 3 here) --
sinks6='\x00\x00\x00\x3f\x00\x00\x80\xbf\x00\x00\x00\x40\x00\x00\x80\xff\x00\x00\x00\x00\x00\x00\x80\x3f'
npy_f32 "$work/sinks.npy" "2, 3" "$sinks6"    # 0.5 -1 2 -inf 0 1
npy_f32 "$work/sinks6.npy" "6," "$sinks6"
npy_f32 "$work/sinks_nan.npy" "6," '\x00\x00\xc0\x7f'"${sinks6:16}"
for algo in flash naive chunked-unstable; do
  expect_check "sinks $algo" "${run[@]}" attention "${inputs[@]}" --out "$d/o.npy" --lse "$d/lse.npy" --algo "$algo" \
    --causal --causal-offset -3 --sinks "$work/sinks.npy" --check
done
expect_check "sinks [K*G]" "${run[@]}" attention "${inputs[@]}" --out "$d/o_s6.npy" --sinks "$work/sinks6.npy" --check
expect_ok "sinks [K,G]" "${run[@]}" attention "${inputs[@]}" --out "$d/o_s.npy" --sinks "$work/sinks.npy"
if cmp -s "$d/o_s.npy" "$d/o_s6.npy"; then pass; else fail "--sinks [K,G] and [K*G] differ"; fi
if cmp -s "$d/o_s.npy" "$d/o_default.npy"; then fail "--sinks changed nothing"; else pass; fi
expect_error "sinks bad shape" "expected [K,G] = [2,3] or [K*G] = [6]" "${run[@]}" attention "${inputs[@]}" \
  --out "$d/o.npy" --sinks "$work/hk.npy"
expect_error "sinks NaN" "sinks: head 0 (k 0, g 0) has sink nan" "${run[@]}" attention "${inputs[@]}" \
  --out "$d/o.npy" --sinks "$work/sinks_nan.npy"

echo "cli_test: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
