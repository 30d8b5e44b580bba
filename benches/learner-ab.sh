#!/usr/bin/env bash
# Two kevin binaries' learner steps on one GPU, alternated, so that the machine's own state (its
# clocks, a cold kernel cache, another tenant) weighs on both alike: A B A B ..., each a
# `kevin bench policy` of the learner alone, then each binary's best and median step.
#
#   bash benches/learner-ab.sh OLD_KEVIN NEW_KEVIN [ROUNDS] [-- extra bench flags]
#
# ROUNDS defaults to 2; the bench flags default to the 0.5B shape in bf16 (`--shape qwen2-0.5b
# --dtype bf16 --train-steps 5`). Needs a GPU. Prints one line per run and a table last.
set -euo pipefail
A=${1:?usage: learner-ab.sh OLD_KEVIN NEW_KEVIN [ROUNDS] [-- bench flags]}
B=${2:?usage: learner-ab.sh OLD_KEVIN NEW_KEVIN [ROUNDS] [-- bench flags]}
ROUNDS=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
FLAGS=("$@")
[ ${#FLAGS[@]} -gt 0 ] || FLAGS=(--shape qwen2-0.5b --dtype bf16 --train-steps 5)
LOG=$(mktemp -d)
for r in $(seq 1 "$ROUNDS"); do
    for side in A B; do
        bin=$A; [ $side = B ] && bin=$B
        "$bin" bench policy --device cuda --batches 1 --prompt 16 --new-tokens 2 "${FLAGS[@]}" \
            > /dev/null 2> "$LOG/$side-$r.err" || { echo "$side round $r failed:"; tail -3 "$LOG/$side-$r.err"; exit 1; }
        ms=$(grep -oE 'learner [0-9]+x[0-9]+: [0-9]+ tokens/s \([0-9]+ ms' "$LOG/$side-$r.err" | grep -oE '[0-9]+ ms$' | tr -dc 0-9)
        echo "$side round $r: $ms ms a step ($(grep -oE 'warm-up: .*' "$LOG/$side-$r.err"))"
        echo "$ms" >> "$LOG/$side"
    done
done
stat() { sort -n "$LOG/$1" | awk '{v[NR]=$1} END {printf "%d | %d", v[1], v[int((NR+1)/2)]}'; }
echo "| binary | best ms | median ms |"
echo "| --- | --- | --- |"
echo "| A $A | $(stat A) |"
echo "| B $B | $(stat B) |"
rm -rf "$LOG"
