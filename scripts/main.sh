#!/usr/bin/env bash
# The main job: builds flashgqa, generates random inputs, runs `flashgqa attention` with flash on them,
# checks the result against the float64 reference and prints the time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target flashgqa
dir=out/demo
shape=${FLASHGQA_SHAPE:-1,2,4,1024,1024,128}
build/flashgqa random --shape "$shape" --dtype bfloat16 --seed 1 --dir "$dir"
echo "shape B,K,G,T,S,H = $shape (bfloat16)"
for algo in naive chunked kernel1 flash; do
  build/flashgqa attention --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" --out "$dir/out_$algo.npy" \
    --algo "$algo" --repeat 3 --check
done
