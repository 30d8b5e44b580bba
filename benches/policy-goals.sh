#!/usr/bin/env bash
# Every goal of issue 18 in one call on one GPU, beside transformers (as
# `benches/results/policy-h100-2026-12-05b.md` ran them): the GPU tests, the 4M policy's decode
# step at 64 slots, and for Qwen2-0.5B and Qwen2.5-1.5B generation at batch 64 and 1 and the
# learner (8 x 1024) against the peer's pure bf16 and mixed precision. About 7 minutes on an
# H100. Needs a GPU, python3 with torch and transformers (for benches/hf_policy.py).
#
#   KEVIN=target/release/kevin OUT=runs/policy-goals bash benches/policy-goals.sh
#
# Knobs (environment): QWEN2_GPU (the `qwen2_gpu` test binary: `cargo test --release -p
# kevin-policy --test qwen2_gpu --no-run` names it; the tests are skipped without it), SHAPES
# ("qwen2-0.5b qwen2.5-1.5b"). Each step's output is in OUT; the learner's phases are logged at
# debug level (kevin_policy::train, kevin_policy::optim). The loop's goal (15 turns/s) is
# `kevin bench modes`' (`benches/results/modes-cache-h100-2026-12-06.md`), not run here.
set -uo pipefail
KEVIN=${KEVIN:-target/release/kevin}
OUT=${OUT:-runs/policy-goals}
SHAPES=${SHAPES:-qwen2-0.5b qwen2.5-1.5b}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
LOG=(--log info,kevin_policy::train=debug,kevin_policy::optim=debug)

if [ -n "${QWEN2_GPU:-}" ]; then
    step "GPU tests"
    (cd policy && KEVIN_GPU_TESTS=1 "$QWEN2_GPU" --test-threads 1 --nocapture) > "$OUT/gputests.log" 2>&1
    grep -E '^test result' "$OUT/gputests.log" >&2
fi

step "4M policy: decode step at 64 slots"
"$KEVIN" bench policy --device cuda --train-steps 0 --dtype f32 --shape kevin-4m --batches 64 \
    --prompt 512 --new-tokens 512 --json "$OUT/kevin-4m.json" > "$OUT/kevin-4m.out" 2>&1
tail -4 "$OUT/kevin-4m.out" >&2

for shape in $SHAPES; do
    step "$shape: transformers (pure bf16, then mixed precision)"
    python3 benches/hf_policy.py --shape "$shape" --reps 1 --train-steps 3 \
        --json "$OUT/hf-$shape.json" > "$OUT/hf-$shape.log" 2>&1
    python3 benches/hf_policy.py --shape "$shape" --mixed --batches 1 --new 2 --prompt 16 --reps 1 \
        --train-steps 3 --json "$OUT/hfm-$shape.json" > "$OUT/hfm-$shape.log" 2>&1
    step "$shape: kevin against both"
    "$KEVIN" "${LOG[@]}" bench policy --shape "$shape" --device cuda --dtype bf16 --train-steps 3 \
        --hf "$OUT/hf-$shape.json" --json "$OUT/kevin-$shape.json" > "$OUT/kevin-$shape.out" 2> "$OUT/kevin-$shape.err"
    "$KEVIN" "${LOG[@]}" bench policy --shape "$shape" --device cuda --dtype bf16 --batches 1 --prompt 16 \
        --new-tokens 2 --train-steps 3 --hf "$OUT/hfm-$shape.json" --json "$OUT/kevin-mixed-$shape.json" \
        > "$OUT/kevin-mixed-$shape.out" 2> "$OUT/kevin-mixed-$shape.err"
done

step "summary"
for shape in $SHAPES; do
    echo "### $shape (pure bf16 peer, then the mixed-precision peer's learner)"
    grep -E '^\| (generate|learner)' "$OUT/kevin-$shape.out"
    grep -E '^\| learner' "$OUT/kevin-mixed-$shape.out"
    grep -E 'GPU memory' "$OUT/kevin-$shape.out"
done
grep -E 'decode|tokens/s' "$OUT/kevin-4m.out" | tail -3
