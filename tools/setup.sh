#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: installs the dependencies, builds BlueVM, and runs
# the main job on the GPU (or lavapipe): 10,000 instances searching Collatz chains.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
./build/host/bluevm devices
./build/host/bluevm run programs/collatz.blue --instances 10000 --stats
