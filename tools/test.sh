#!/usr/bin/env bash
# Builds BlueVM and runs the whole test suite with the Khronos validation layer on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
export BLUE_VALIDATION=${BLUE_VALIDATION:-1}
"${BUILD_DIR:-build}/tests/blue_tests" "$@"
