#!/bin/bash
# Runs the test binary as K processes at once, each over its share of the test files (dealt in
# turn), for a machine with many cores and one GPU (a lent GPU machine: see pack_for_gpu.sh).
# Logs go to DIR/shardN.log; prints each shard's doctest summary and its failures, and exits 1
# if any shard failed.
#
#   bash tools/test_shards.sh 6 /tmp/shards [doctest options, e.g. -tce='cli:*']
set -uo pipefail
k=${1:?usage: tools/test_shards.sh K DIR [doctest options]}
dir=${2:?usage: tools/test_shards.sh K DIR [doctest options]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
tests=${BLUE_TESTS:-$root/build/tests/blue_tests}
mkdir -p "$dir"
mapfile -t files < <(cd "$root/tests" && ls test_*.cpp)
pids=()
for ((i = 0; i < k; ++i)); do
    mine=()
    for ((j = i; j < ${#files[@]}; j += k)); do mine+=("*${files[j]}"); done
    [ ${#mine[@]} -eq 0 ] && continue
    (IFS=,; exec "$tests" -sf="${mine[*]}" "$@") > "$dir/shard$i.log" 2>&1 &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
for ((i = 0; i < k; ++i)); do
    [ -f "$dir/shard$i.log" ] || continue
    echo "== shard $i: $(grep -E '^\[doctest\] test cases' "$dir/shard$i.log")"
    grep -E -A4 'ERROR:|FATAL' "$dir/shard$i.log" | head -20
done
exit $failed
