#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: installs the dependencies, builds BlueVM, and runs
# the main jobs on the GPU (or lavapipe): 10,000 instances searching Collatz chains, text
# generation with the real model in ../shared/models/stories260K, and a cascade of models
# (programs/review_loop.cas) deciding its stages on the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
./build/host/bluevm devices
./build/host/bluevm run programs/collatz.blue --instances 10000 --stats
model=../shared/models/stories260K/stories260K.gguf
if [ -f "$model" ]; then
  ./build/host/bluevm generate -m "$model" -p "Once upon a time" -n 120 --temp 0 --stats
  ./build/compiler/bluec cascade programs/review_loop.cas -o build/review_loop.bir
  ./build/host/bluevm run build/review_loop.bir --prompt "Once upon a time" --seed 1 --stats
fi
