#!/usr/bin/env bash
# Cascade benchmarks, side by side in one run (the README's "Cascades" figures):
#  1. speculative decoding: programs/speculative.cas with stories260K drafting for an upcycled
#     stories260K (blue-upcycle --layers 10 --heads-x 2 --ffn 688 --noise 0.02), against the
#     same stage on the target alone; greedy, 256 tokens; acceptance, tokens per target pass,
#     wall time;
#  2. a three-stage greedy cascade (draft, refine, moral) in one `bluevm run`, against the same
#     stages as three `bluevm generate` processes with the host building each prompt from the
#     previous text (host in the loop): wall time, submits and round trips;
#  3. best of N (programs/best_of.cas) with its branches at once on sibling instances against
#     the same branches one after another (--siblings 0), with stories260K and the upcycled model.
# Usage: tools/bench_cascade.sh [ROUNDS]   (build first: tools/build.sh; BUILD_DIR overrides build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
B=${BUILD_DIR:-build}
M=$(realpath "${BLUE_SHARED:-../shared}/models/stories260K/stories260K.gguf")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now_ms() { date +%s%3N; }
field() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }

"$B/tools/synth/blue-upcycle" "$M" "$work/big.gguf" --layers 10 --heads-x 2 --ffn 688 --noise 0.02
"$B/compiler/bluec" cascade programs/speculative.cas --model draft="$M" --model target="$work/big.gguf" -o "$work/spec.bir"
grep -v -e speculate -e '^model draft' programs/speculative.cas > "$work/alone.cas"
"$B/compiler/bluec" cascade "$work/alone.cas" --model target="$work/big.gguf" -o "$work/alone.bir"

echo
echo "## Speculative decoding (greedy, 256 tokens, $rounds rounds each, alternating)"
spec_total=0; alone_total=0
for r in $(seq "$rounds"); do
  for kind in spec alone; do
    "$B/host/bluevm" run "$work/$kind.bir" --prompt "Once upon a time" --stats >"$work/$kind.out" 2>"$work/$kind.err"
    ms=$(field wall_ms <"$work/$kind.err")
    if [ "$kind" = spec ]; then spec_total=$(echo "$spec_total + $ms" | bc); else alone_total=$(echo "$alone_total + $ms" | bc); fi
  done
done
cmp -s "$work/spec.out" "$work/alone.out" && same=yes || same=NO
echo "| | wall ms (mean) | acceptance | tokens per target pass | cycles |"
echo "| --- | --- | --- | --- | --- |"
echo "| target alone | $(echo "scale=1; $alone_total / $rounds" | bc) | | 1 | $(field cycles <"$work/alone.err") |"
echo "| speculative (draft stories260K) | $(echo "scale=1; $spec_total / $rounds" | bc) | $(field acceptance <"$work/spec.err") | $(field tokens_per_pass <"$work/spec.err") | $(field cycles <"$work/spec.err") |"
echo "speedup (target alone / speculative): $(echo "scale=2; $alone_total / $spec_total" | bc); same text: $same"

echo
echo "## Three greedy stages: one cascade against three generate calls ($rounds rounds each)"
cat >"$work/three.cas" <<EOF
model m = "$M"
slot draft[64]
slot story[96]
slot moral[48]
stage draft_it {
    prompt input
    write draft
    max_tokens 48
    temperature 0
}
stage refine {
    prompt input + draft
    write story
    max_tokens 64
    temperature 0
}
stage moral_it {
    prompt story + " The moral of the story is"
    write moral
    max_tokens 32
    temperature 0
}
output draft, story, moral
EOF
"$B/compiler/bluec" cascade "$work/three.cas" -o "$work/three.bir"
task="Once upon a time"
cas_total=0; gen_total=0; gen_submits=0; gen_rt=0
for r in $(seq "$rounds"); do
  t0=$(now_ms)
  "$B/host/bluevm" run "$work/three.bir" --prompt "$task" --stats >"$work/three.out" 2>"$work/three.err"
  t1=$(now_ms)
  cas_total=$((cas_total + t1 - t0))
  t0=$(now_ms)
  d=$("$B/host/bluevm" generate -m "$M" -p "$task" -n 48 --temp 0 --no-echo --stats 2>"$work/g1.err")
  s=$("$B/host/bluevm" generate -m "$M" -p "$task$d" -n 64 --temp 0 --no-echo --stats 2>"$work/g2.err")
  "$B/host/bluevm" generate -m "$M" -p "$s The moral of the story is" -n 32 --temp 0 --no-echo --stats >/dev/null 2>"$work/g3.err"
  t1=$(now_ms)
  gen_total=$((gen_total + t1 - t0))
done
for g in g1 g2 g3; do
  gen_submits=$((gen_submits + $(field submits <"$work/$g.err")))
  gen_rt=$((gen_rt + $(field round_trips <"$work/$g.err")))
done
echo "| | wall ms per task (processes included) | submits | round trips |"
echo "| --- | --- | --- | --- |"
echo "| one cascade (\`bluevm run\`) | $((cas_total / rounds)) | $(field submits <"$work/three.err") | $(field round_trips <"$work/three.err") |"
echo "| three \`bluevm generate\` calls | $((gen_total / rounds)) | $gen_submits | $gen_rt inside the calls + 2 stage hand-offs through the host |"

echo
echo "## Best of N (programs/best_of.cas: fork 4 then fork 3): branches at once on sibling instances against one after another ($rounds rounds each, alternating)"
echo "| writer model | branches | wall ms (mean) | cycles | submits | same text |"
echo "| --- | --- | --- | --- | --- | --- |"
for model in "$M" "$work/big.gguf"; do
  "$B/compiler/bluec" cascade programs/best_of.cas --model writer="$model" -o "$work/best.bir"
  at_total=0; seq_total=0
  for r in $(seq "$rounds"); do
    for kind in at seq; do
      args=(); [ "$kind" = seq ] && args=(--siblings 0)
      "$B/host/bluevm" run "$work/best.bir" --prompt "" --seed "$r" --stats "${args[@]}" >"$work/best_$kind.out" 2>"$work/best_$kind.err"
      ms=$(field wall_ms <"$work/best_$kind.err")
      if [ "$kind" = at ]; then at_total=$(echo "$at_total + $ms" | bc); else seq_total=$(echo "$seq_total + $ms" | bc); fi
    done
    cmp -s "$work/best_at.out" "$work/best_seq.out" || { echo "best_of: the texts differ at seed $r" >&2; exit 1; }
  done
  name=$([ "$model" = "$M" ] && echo stories260K || echo "upcycled (10 layers)")
  for kind in seq at; do
    label=$([ "$kind" = at ] && echo "at once (siblings)" || echo "one after another (--siblings 0)")
    total=$([ "$kind" = at ] && echo "$at_total" || echo "$seq_total")
    echo "| $name | $label | $(echo "scale=1; $total / $rounds" | bc) | $(field cycles <"$work/best_$kind.err") | $(field submits <"$work/best_$kind.err") | yes |"
  done
done
