#!/usr/bin/env bash
# The main job: builds flashgqa and runs the seed's study on this machine — the measured ceilings and
# roofline (flashgqa roofline), then the ladder timed over sequence lengths next to its predictions
# (flashgqa bench, about 2 minutes on 2 cores; table on stdout, CSV/JSON/SVG in out/bench), then one
# flash run on generated inputs checked against the float64 reference, then the Python package against
# the CPU attention users would otherwise call (python -m flashgqa.compare: PyTorch's SDPA and
# jax.nn.dot_product_attention where installed; table on stdout, chart in out/compare.svg).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target flashgqa
build/flashgqa roofline
echo
build/flashgqa bench --out out/bench
echo
dir=out/demo
build/flashgqa random --shape 1,2,4,1024,1024,128 --dtype bfloat16 --seed 1 --dir "$dir"
echo "flash on B,K,G,T,S,H = 1,2,4,1024,1024,128 (bfloat16) against the float64 reference:"
build/flashgqa attention --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" --out "$dir/out.npy" \
  --algo flash --repeat 5 --check
echo
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
python3 -c "import numpy, ml_dtypes, scikit_build_core, nanobind" 2>/dev/null ||
  python3 -m pip install -q numpy ml_dtypes scikit-build-core nanobind
python3 -m pip install -q --no-build-isolation -Cbuild-dir=build-python ./
mkdir -p out
python3 -m flashgqa.compare --lengths 1024,2048 --chart out/compare.svg
