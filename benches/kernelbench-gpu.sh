#!/usr/bin/env bash
# KernelBench on a GPU machine, end to end (issue 20), in one run so that both sides of every
# comparison are measured together: import the problem files; time kevin's eager baseline and
# torch eager on every problem at the files' sizes; write, verify and time the naive writer's
# kernel of every problem; cross-check kevin's fp64 reference against the original models; check
# the baseline and its fp64 reference plan against the interpreter. Needs the kevin binary and
# python3 with torch, cupy and numpy (the GPU machine has them); no cargo.
#
#   KEVIN=target/release/kevin SRC=KernelBench/KernelBench OUT=runs/kb bash benches/kernelbench-gpu.sh
#
# Knobs (environment): STEPS (any of "baseline naive crosscheck check", default all), REPS (10),
# TASKS (comma-separated task names, default every import). Every step's output is kept under
# OUT (kevin-gpu.json, torch-gpu.json, table.json, naive.json, crosscheck.json, *.txt); the
# summary lines come last. A step's failure is reported and the next one runs.
set -uo pipefail
KEVIN=${KEVIN:-target/release/kevin}
SRC=${SRC:?set SRC to the KernelBench folder that holds level1/ and level2/}
OUT=${OUT:-runs/kernelbench}
STEPS=${STEPS:-baseline naive crosscheck check}
REPS=${REPS:-10}
TASKS=${TASKS:-}
mkdir -p "$OUT"
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
only=()
[ -n "$TASKS" ] && only=(--tasks "$TASKS")
summary=()

if [ ! -d "$OUT/tasks" ]; then
    step import
    "$KEVIN" tasks import-kernelbench "$SRC" --out "$OUT/tasks" --json "$OUT/import.json" > "$OUT/import.txt"
fi
summary+=("import: $(grep -E '^level [0-9]+: imported' "$OUT/import.txt" | tr '\n' ' ')")

if has baseline; then
    step "kevin's baseline (--reps $REPS)"
    "$KEVIN" tasks --dir "$OUT/tasks" baseline --preset gpu --reps "$REPS" "${only[@]}" \
        --json "$OUT/kevin-gpu.json" > "$OUT/kevin-gpu.txt" 2>&1 || summary+=("kevin's baseline: FAILED (kevin-gpu.txt)")
    step "torch eager"
    rm -rf "$OUT/plans"
    "$KEVIN" tasks --dir "$OUT/tasks" baseline --plans "$OUT/plans" "${only[@]}" > /dev/null
    python3 scripts/baseline_gpu.py "$OUT/plans" --preset gpu --time-only --reps "$REPS" --budget-s 0.5 \
        ${TASKS:+--tasks "$TASKS"} --json "$OUT/torch-gpu.json" > "$OUT/torch-gpu.txt" 2>&1 \
        || summary+=("torch eager: exit $? (torch-gpu.txt; a plan that fails its check exits 1)")
    if [ -s "$OUT/kevin-gpu.json" ] && [ -s "$OUT/torch-gpu.json" ]; then
        python3 scripts/kernelbench_table.py "$OUT/kevin-gpu.json" "$OUT/torch-gpu.json" \
            --json "$OUT/table.json" > "$OUT/table.txt"
        summary+=("$(head -1 "$OUT/table.txt") (every task outside 15%: table.txt)")
    fi
fi

if has naive; then
    step "naive kernels"
    rm -rf "$OUT/naive"
    "$KEVIN" tasks --dir "$OUT/tasks" naive --out "$OUT/naive" "${only[@]}" > "$OUT/naive-write.txt"
    "$KEVIN" eval --kernels "$OUT/naive" --dir "$OUT/tasks" --backend cuda "${only[@]}" \
        --json "$OUT/naive.json" > "$OUT/naive.txt" 2>&1 \
        && summary+=("naive kernels: $(grep -iE 'correct' "$OUT/naive.txt" | tail -1)") \
        || summary+=("naive kernels: FAILED: $(tail -1 "$OUT/naive.txt")")
fi

if has crosscheck; then
    step "cross-check against the original models"
    python3 scripts/kernelbench_crosscheck.py --src "$SRC" --tasks "$OUT/tasks" --kevin "$KEVIN" \
        --json "$OUT/crosscheck.json" > "$OUT/crosscheck.txt" 2>&1
    summary+=("cross-check: $(tail -1 "$OUT/crosscheck.txt")")
fi

if has check; then
    step "baseline --check (small preset)"
    "$KEVIN" tasks --dir "$OUT/tasks" baseline --preset small --reps 1 --check "${only[@]}" > "$OUT/check.txt" 2>&1
    summary+=("baseline --check: $(tail -1 "$OUT/check.txt")")
fi

step done
printf '%s\n' "${summary[@]}"
