#!/usr/bin/env bash
# Builds BlueVM and runs the test suite with the Khronos validation layer on (core and
# synchronization checks; any validation message fails a test), then again as other devices:
#   - emulated devices: their limits (BLUE_DEVICE_LIMITS: NVIDIA, AMD, Intel, Mali and the
#     minimum; a profile that lowers no limit of the device at hand is skipped) and lavapipe's
#     subgroup sizes 16 (with Mali's limits) and 4 (with the minimum's; the first run is 8)
#   - GPU-assisted validation (BLUE_VALIDATION=gpu) over the GPU kernel and program tests
#   - AddressSanitizer + UBSan build (tools/test_sanitize.sh) over the host-code test files
# The openai npm client test (tests/openai_client) skips without node or its node_modules, except
# after tools/install_deps.sh installed them (BLUE_REQUIRE_OPENAI_CLIENT=1).
# Usage: tools/test.sh [--quick] [doctest options]   (--quick: the first run only)
# Ends with one line "tests: N passed, N failed" counting every run's test cases.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
build_start=$SECONDS
bash tools/build.sh
printf '%-36s %ds\n' "build" $((SECONDS - build_start))
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
export BLUE_VALIDATION=${BLUE_VALIDATION:-1}
# tools/install_deps.sh installed the openai npm client: its test must run, not skip.
if [ -f tests/openai_client/.npm_ci_ok ]; then
  export BLUE_REQUIRE_OPENAI_CLIENT=${BLUE_REQUIRE_OPENAI_CLIENT:-1}
fi
tests="${BUILD_DIR:-build}/tests/blue_tests"
logs=$(mktemp -d)
passed=0
failed=0
runs_failed=()

# run NAME [ENV=VALUE ...] -- [doctest options]: one run of the suite, summarised in one line.
run() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do
    envs+=("$1")
    shift
  done
  shift
  local log="$logs/$name.log" start=$SECONDS rc=0
  env "${envs[@]}" "$tests" "$@" >"$log" 2>&1 || rc=$?
  local line p f
  line=$(grep -E '^\[doctest\] test cases:' "$log" | tail -1 || true)
  p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line")
  f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
  [[ "$p" =~ ^[0-9]+$ ]] || p=0
  [[ "$f" =~ ^[0-9]+$ ]] || f=0
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed before its summary
  passed=$((passed + p))
  failed=$((failed + f))
  printf '%-36s %4d passed, %d failed  (%ds)\n' "$name" "$p" "$f" $((SECONDS - start))
  if [ "$rc" -ne 0 ]; then
    runs_failed+=("$name")
    echo "---- $name: last 60 lines of its log ($log) ----"
    tail -60 "$log"
    echo "----"
  fi
}

run suite -- "$@"
if [ "$quick" -eq 0 ]; then
  # The device variants (other subgroup sizes, other devices' limits) run the test files whose
  # work differs by device: the GPU kernels and machine, synchronization, the memory plan and
  # its tiers, the model runs on the GPU (architectures, MoE, quantizations, structured output,
  # speculation), serving's batching and the cascades decided on the GPU. The rest is host code
  # over those same kernels (the HTTP server, the command line, the C API, the loaders and their
  # mutation tests, tokenizers, the grammar compiler, the write-ahead log, device-loss fault
  # injection, the openai npm client) and runs once, in the first pass and the sanitizer pass.
  # Within those files, the long end-to-end runs whose kernels the per-op tests already cover on
  # every device run once too (48 requests of prefix reuse, 256 tokens of speculative decoding,
  # 200 random schemas of structured output, the cascade programs against the reference
  # interpreter and their mutants, served forks).
  device_files='-sf=*test_ops_gpu*,*test_sync.cpp,*test_gpu_machine.cpp,*test_interp.cpp,*test_machine_plan.cpp,*test_device_limits.cpp,*test_memory.cpp,*test_kv_snapshot.cpp,*test_llm_ref.cpp,*test_moe.cpp,*test_archs.cpp,*test_structured.cpp,*test_spec.cpp,*test_serving.cpp,*test_prefix_reuse.cpp,*test_programs.cpp,*test_kernel.cpp,*test_cascade.cpp,*test_cascade_select.cpp,*test_cascade_spec.cpp,*test_cascade_fork.cpp,*test_kv_pages.cpp,*test_interp_walks.cpp'
  host_heavy='-tce=structured: 200 random*,prefix reuse: 48 requests*,speculate: greedy speculative decoding equals*,fork: served*,fork: bluevm run*,cascade: every program in programs/ through bluec*,cascade: mutated*,cascade: every program in programs/ gives*'
  # Each device pass emulates one device: its limits (BLUE_DEVICE_LIMITS) and, where lavapipe can
  # give it, its subgroup size (LP_NATIVE_VECTOR_WIDTH: 128 bits = 4 lanes, 512 = 16; the first
  # run is 8). Mali-G610 runs subgroups of 16; the minimum device gets 4, smaller than any
  # kernel's assumption. A profile that lowers none of this device's limits (`bluevm devices`
  # says so) would repeat the first run exactly: it is skipped, with a line saying why.
  bluevm="${BUILD_DIR:-build}/host/bluevm"
  for entry in nvidia-rtx4090:256 amd-rx7900xtx-radv:256 intel-arc-a770-anv:256 mali-g610-panvk:512 bluevm-minimum:128; do
    profile=${entry%%:*}
    width=${entry##*:}
    name="limits-$profile"
    [ "$width" != 256 ] && name+="+subgroup-$((width / 32))"
    if [ -f "host/device_profiles/$profile.json" ]; then
      if "$bluevm" devices --device-limits "$profile" 2>/dev/null | grep -q "no limit lower than the device's"; then
        if [ "$width" = 256 ]; then
          printf '%-36s skipped: it lowers no limit of this device (the first run covers it)\n' "$name"
          continue
        fi
      fi
      run "$name" BLUE_DEVICE_LIMITS="$profile" LP_NATIVE_VECTOR_WIDTH="$width" -- "$device_files" "$host_heavy" "$@"
    fi
  done
  # With the plan's fused dispatches off (BLUE_FUSE=0): with them, lavapipe's LLVM spent more than
  # 15 minutes (CoroSplit, SROA) compiling an instrumented kernel variant that stories260K's
  # stacked plan dispatches, not yet identified (README, Correct on every device). The fused
  # dispatches run in every other pass, under core and synchronization validation.
  run gpu-assisted-validation BLUE_VALIDATION=gpu BLUE_FUSE=0 -- -tc='every golden program*,stories260K greedy from BOS on the GPU*' "$@"
  # The sanitizer pass runs the test files of host code, where memory errors live: every loader
  # of untrusted input and its mutation tests (bytecode, GGUF, cascade sources and modules,
  # grammars and schemas, KV snapshots, HTTP requests), the tokenizers, quantization, the
  # compiler, the server, the C API and the command line (the programs they start are
  # instrumented too), and the short GPU runs that drive the engine and the machine. ASan
  # intercepts every allocation of lavapipe's LLVM as well, which makes GPU-heavy cases 3-9x
  # slower, so the long GPU runs whose host code the cases kept already execute are left out.
  sanitize_files='-sf=*/test_asm.cpp,*/test_isa.cpp,*/test_interp.cpp,*/test_interp_walks.cpp,*/test_verify.cpp,*/test_gguf.cpp,*/test_model_config.cpp,*/test_tokenizer.cpp,*/test_pretokenize.cpp,*/test_chat_template.cpp,*/test_quant.cpp,*/test_quantize.cpp,*/test_synth.cpp,*/test_upcycle.cpp,*/test_grammar.cpp,*/test_kv_snapshot.cpp,*/test_machine_plan.cpp,*/test_device_limits.cpp,*/test_server.cpp,*/test_tools.cpp,*/test_capi.cpp,*/test_cli.cpp,*/test_structured.cpp,*/test_openai_client.cpp,*/test_sync.cpp,*/test_gpu_machine.cpp,*/test_llm_ref.cpp,*/test_programs.cpp,*/test_cascade.cpp'
  sanitize_skip='-tce=structured: 200 random*,server: 64 concurrent*,cli: generate --kv-save then*,cli: bluevm serve gives*,cli: stories260K quantized*,cli: bluevm quantize --type*,cli: generate --logprobs N prints*,the collatz run*,cascade: every program*,cascade: a repeat loop*,cascade: the entropy rule*,cascade: two different models*,capi: bluevm_generate saves*'
  if [ -x tools/test_sanitize.sh ] || [ -f tools/test_sanitize.sh ]; then
    start=$SECONDS
    if bash tools/test_sanitize.sh "$sanitize_files" "$sanitize_skip" "$@" >"$logs/sanitize.log" 2>&1; then
      s=$(grep -E '^\[doctest\] test cases:' "$logs/sanitize.log" | tail -1 | sed -E 's/.*\| *([0-9]+) passed.*/\1/')
      [[ "$s" =~ ^[0-9]+$ ]] || s=0
      passed=$((passed + s))
      printf '%-36s %4d passed, 0 failed  (%ds: %s)\n' "asan+ubsan" "$s" $((SECONDS - start)) \
        "$(grep -oE 'build [0-9]+s, run [0-9]+s' "$logs/sanitize.log" | tail -1)"
    else
      failed=$((failed + 1))
      runs_failed+=("asan+ubsan")
      echo "---- asan+ubsan: last 80 lines of its log ----"
      tail -80 "$logs/sanitize.log"
    fi
  fi
fi
if [ ${#runs_failed[@]} -gt 0 ]; then echo "failed runs: ${runs_failed[*]}"; fi
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
