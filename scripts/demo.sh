#!/usr/bin/env bash
# `make demo`: the main job on embedded defaults. Uses only this repository
# (data/ and the built binary), never ../shared.
#   1. generate a mixed training+serving workload of the design's model
#   2. import a real PyTorch Execution Trace (ResNet, data/pytorch-et)
#   3. capture a real PyTorch RLHF-style run on this CPU (python/u3m_capture)
#   4. evaluate every access predictor on all three
#   5. plan device memory for a training step: static plan vs the caching pool
#   6. replay a training trace through the real runtime under half its footprint
#   7. training capacity per tiering policy on 4 x Ascend 910B (simulated)
#   8. serving goodput per KV policy on 4 x Ascend 910B (simulated)
#   9. PyTorch training and generation under u3m on this CPU (measured)
#  10. the design's cost scenario: tiered memory against more cards (simulated, priced)
# and ends by writing the HTML report of the results (u3m report) and printing its path.
#
# Prints a short summary; every command's full output is kept in the demo directory.
# U3M_DEMO_FULL=1 (or --full as the second argument) prints the full tables as well.
set -euo pipefail
U3M=${1:-build/release/apps/u3m/u3m}
full=${U3M_DEMO_FULL:-0}
[ "${2:-}" = --full ] && full=1
root=$(cd "$(dirname "$0")/.." && pwd)
out=${U3M_DEMO_DIR:-$(mktemp -d /tmp/u3m-demo.XXXXXX)}
mkdir -p "$out"
section() { if [ "$full" = 1 ]; then printf '\n==== %s\n\n' "$*"; else printf '\n%s\n' "$*"; fi; }
# step NAME LINES CMD...: runs CMD with its output kept in $out/NAME.txt; prints all of it
# when full, else the lines the sed script LINES selects.
step() {
  local name=$1 lines=$2
  shift 2
  # stderr too (progress lines); shown in full if the command fails
  if ! "$@" > "$out/$name.txt" 2>&1; then cat "$out/$name.txt" >&2; return 1; fi
  if [ "$full" = 1 ]; then cat "$out/$name.txt"; else sed -n "$lines" "$out/$name.txt" | sed 's/^ */  /'; fi
}
# json NAME CMD...: CMD --json into $out/NAME.json (the report's input); the full text too when full.
json() {
  local name=$1
  shift
  "$@" --json > "$out/$name.json"
  if [ "$full" = 1 ]; then "$@"; echo; fi
}
stats='/^events\|^tensors/p'

section "1. Generated mixed workload: llama2-13b training + serving time-shared on one device (nominal roofline times)"
"$U3M" trace gen --model llama2-13b --workload mixed --pattern timeshare --requests 16 -o "$out/mixed.u3mt" > "$out/gen-mixed.txt"
step stats-mixed "$stats" "$U3M" trace stats "$out/mixed.u3mt"

section "2. Real PyTorch Execution Trace: ResNet training, 3 iterations (data/pytorch-et, MIT)"
"$U3M" trace import "$root/data/pytorch-et/resnet_et.json.gz" -o "$out/resnet.u3mt" > "$out/import-resnet.txt" 2>&1
step stats-resnet "$stats" "$U3M" trace stats "$out/resnet.u3mt"

section "3. Real capture: RLHF-style loop (generate rollouts, then train) of a small LLaMA-shaped model, measured on this CPU"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  step capture '$p' env PYTHONPATH="$root/python" /usr/bin/python3 -m u3m_capture rlhf --rounds 3 -o "$out/rlhf.jsonl"
  "$U3M" trace import "$out/rlhf.jsonl" -o "$out/rlhf.u3mt" > "$out/import-rlhf.txt" 2>&1
  step stats-rlhf "$stats" "$U3M" trace stats "$out/rlhf.u3mt"
  traces=("$out/mixed.u3mt" "$out/resnet.u3mt" "$out/rlhf.u3mt")
else
  echo "  skipped: /usr/bin/python3 cannot import torch (run scripts/install-deps.sh)"
  traces=("$out/mixed.u3mt" "$out/resnet.u3mt")
fi

section "4. Access prediction on each trace (horizon 64 op steps; see docs/prediction.md): in the summary below"
json predict "$U3M" predict eval "${traces[@]}"

section "5. Device memory for one llama2-13b training step: static plan vs the caching pool (computed from the trace)"
"$U3M" trace gen --model llama2-13b --workload train --steps 2 -o "$out/train.u3mt" >/dev/null
step mem-plan '/^most bytes live\|^static plan  \|^pool, expandable/p' "$U3M" mem plan "$out/train.u3mt"

section "6. The real runtime: a tiny training trace replayed with real bytes under a device budget of half its footprint (measured on this machine)"
"$U3M" trace gen --model tiny --workload train --steps 2 -o "$out/tiny-train.u3mt" >/dev/null
timeline=()
# The occupancy plot, where this build's replay writes timelines (docs/operators.md).
"$U3M" run replay --help | grep -q -- --timeline && timeline=(--timeline "$out/replay-timeline.json")
step replay '1p;/^  data:/p' "$U3M" run replay "$out/tiny-train.u3mt" --device-fraction 0.5 --host-budget 8M --ssd-dir "$out" "${timeline[@]}"

section "7. Training capacity per policy, simulated with the ascend-910b-32g profile x 4 cards (docs/training.md): in the summary below"
json train-capacity "$U3M" train capacity
json train-capacity-ga16 "$U3M" train capacity --grad-accum 16 --full-ft none
# Four cards simulated together; card 1 fails and its neighbour carries two shards.
step failover '1p;/slowdown per step/p' "$U3M" train sim --model llama2-13b --fail-card 1@10

section "8. RAG serving goodput per KV policy, simulated with the ascend-910b-32g profile x 4 cards (docs/serving.md): in the summary below"
json serve-rag "$U3M" serve capacity --requests rag:requests=2000 --model llama3-8b
# 200 requests: the serving simulator now runs every KV move through the store on a simulated
# stack, about 25x slower than its old arithmetic on SSD-heavy runs (docs/serving.md).
json serve-mooncake "$U3M" serve capacity --requests "$root/data/requests/mooncake_conversation_trace.jsonl.gz" \
  --limit 200 --model llama3-8b --policies hbm-only,u3m

section "9. PyTorch under u3m, measured on this CPU: training with half the device memory, generation with a quarter of the KV (docs/pytorch.md)"
build=$(cd "$(dirname "$U3M")/../.." && pwd)
if [ -d "$build/python/u3m" ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  step torch-train '$p' env PYTHONPATH="$build/python" /usr/bin/python3 "$root/examples/train_llama_tiny.py" --compare
  step torch-generate '$p' env PYTHONPATH="$build/python" /usr/bin/python3 "$root/examples/generate_llama_tiny.py" --compare
else
  echo "  skipped: the Python extension ($build/python/u3m) or torch is missing (make build)"
fi

section "10. The design's cost scenario: 4 cards with host DRAM and SSDs against more cards (docs/cost.md): in the summary below"
json plan-design "$U3M" plan cost --design

section "Summary of the results (u3m report)"
"$U3M" report "$out"/*.json --summary -o "$out/report.html" | sed 's/^/  /'
echo
echo "demo files in $out"
echo "report: $out/report.html"
