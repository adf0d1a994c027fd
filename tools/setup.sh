#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: installs the dependencies, builds BlueVM, and runs
# the main jobs on the GPU (or lavapipe): 10,000 instances searching Collatz chains, then text
# generation with the real model in ../shared/models/stories260K.
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
fi
