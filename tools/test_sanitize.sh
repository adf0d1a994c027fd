#!/usr/bin/env bash
# Builds BlueVM with AddressSanitizer, LeakSanitizer and UBSan (BLUE_SANITIZE=ON, in build-asan/)
# and runs the test suite there (the cases its doctest options select; tools/test.sh passes the
# host-code test files) with the Khronos validation layer on. Fails on a failed
# test and on any sanitizer report from the test binary or the programs it starts (bluevm, the C
# API example). Leaks inside the Vulkan loader, lavapipe/LLVM and the validation layer are
# suppressed (tests/sanitizers/lsan.supp); BlueVM's are not. Vulkan objects BlueVM forgets to
# destroy are named by the validation layer when the device goes, and fail the run too.
# Usage: tools/test_sanitize.sh [doctest options]   (SANITIZE_BUILD_DIR overrides build-asan)
# Ends with the build and run times.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${SANITIZE_BUILD_DIR:-build-asan}  # never BUILD_DIR: that is the plain build's
start=$SECONDS
BUILD_DIR=$build CMAKE_ARGS="-DBLUE_SANITIZE=ON ${CMAKE_ARGS:-}" bash tools/build.sh
build_s=$((SECONDS - start))

tests="$build/tests/blue_tests"
libasan=$(ldd "$tests" | awk '/libasan/ {print $3}')
if [ -z "$libasan" ]; then
  echo "test_sanitize: $tests is not linked with AddressSanitizer" >&2
  exit 1
fi
# dlclose keeps libraries mapped (see the file), so leaks in the driver and layers keep their names.
shim="$(cd "$build" && pwd)/keep_loaded.so"
cc -shared -fPIC -O2 -o "$shim" tests/sanitizers/keep_loaded.c

reports=$(mktemp -d)
log="$reports/suite.log"
# ASan and LSan reports of every process go to $reports/asan.PID; UBSan's go to stderr (its
# log_path is not honoured next to ASan) and end the process with exit code 87.
asan="detect_leaks=1:halt_on_error=1:check_initialization_order=1:strict_init_order=1"
asan+=":detect_stack_use_after_return=0:log_path=$reports/asan:exitcode=86"
export ASAN_OPTIONS=$asan
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# The validation layer stays on: core and synchronization checks unless a mode is chosen.
if [ -z "${BLUE_VALIDATION:-}" ] || [ "$BLUE_VALIDATION" = 0 ]; then export BLUE_VALIDATION=1; fi

run_start=$SECONDS
rc=0
LD_PRELOAD="$libasan:$shim" "$tests" "$@" >"$log" 2>&1 || rc=$?
run_s=$((SECONDS - run_start))
cat "$log"

problems=()
[ "$rc" -ne 0 ] && problems+=("the suite exited with $rc")
for r in "$reports"/asan.*; do
  [ -e "$r" ] || continue
  problems+=("sanitizer report from process ${r##*.}")
  echo "---- $(basename "$r") ----"
  cat "$r"
done
if grep -q "runtime error:" "$log"; then problems+=("UBSan report"); fi
# Objects left alive at vkDestroyDevice/vkDestroyInstance: the leaks lsan.supp cannot tell apart.
if grep -qE "VUID-vkDestroy(Device-device|Instance-instance)-" "$log"; then
  problems+=("Vulkan objects not destroyed")
fi
echo "test_sanitize: build ${build_s}s, run ${run_s}s"
if [ ${#problems[@]} -gt 0 ]; then
  printf 'test_sanitize: FAILED: %s\n' "${problems[@]}"
  exit 1
fi
rm -rf "$reports"
echo "test_sanitize: no sanitizer report"
