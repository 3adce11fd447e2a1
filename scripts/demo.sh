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
set -euo pipefail
U3M=${1:-build/release/apps/u3m/u3m}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${U3M_DEMO_DIR:-$(mktemp -d /tmp/u3m-demo.XXXXXX)}
mkdir -p "$out"
section() { printf '\n==== %s\n\n' "$*"; }

section "1. Generated mixed workload: llama2-13b training + serving time-shared on one device (nominal roofline times)"
"$U3M" trace gen --model llama2-13b --workload mixed --pattern timeshare --requests 16 -o "$out/mixed.u3mt"
"$U3M" trace stats "$out/mixed.u3mt" | sed '/^op classes/,$d'

section "2. Real PyTorch Execution Trace: ResNet training, 3 iterations (data/pytorch-et, MIT)"
"$U3M" trace import "$root/data/pytorch-et/resnet_et.json.gz" -o "$out/resnet.u3mt"
"$U3M" trace stats "$out/resnet.u3mt" | sed '/^op classes/,$d'

section "3. Real capture: RLHF-style loop (generate rollouts, then train) of a small LLaMA-shaped model, measured on this CPU"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  PYTHONPATH="$root/python" /usr/bin/python3 -m u3m_capture rlhf --rounds 3 -o "$out/rlhf.jsonl"
  "$U3M" trace import "$out/rlhf.jsonl" -o "$out/rlhf.u3mt"
  "$U3M" trace stats "$out/rlhf.u3mt" | sed '/^op classes/,$d'
  traces=("$out/mixed.u3mt" "$out/resnet.u3mt" "$out/rlhf.u3mt")
else
  echo "skipped: /usr/bin/python3 cannot import torch (run scripts/install-deps.sh)"
  traces=("$out/mixed.u3mt" "$out/resnet.u3mt")
fi

section "4. Access prediction on each trace (horizon 64 op steps; see docs/prediction.md)"
for t in "${traces[@]}"; do
  "$U3M" predict eval "$t"
  echo
done
section "5. Device memory for one llama2-13b training step: static plan vs the caching pool (computed from the trace)"
"$U3M" trace gen --model llama2-13b --workload train --steps 2 -o "$out/train.u3mt" >/dev/null
"$U3M" mem plan "$out/train.u3mt"

section "6. The real runtime: a tiny training trace replayed with real bytes under a device budget of half its footprint (measured on this machine)"
"$U3M" trace gen --model tiny --workload train --steps 2 -o "$out/tiny-train.u3mt" >/dev/null
"$U3M" run replay "$out/tiny-train.u3mt" --device-fraction 0.5 --host-budget 8M --ssd-dir "$out"

section "7. Training capacity per policy, simulated with the ascend-910b-32g profile x 4 cards (docs/training.md)"
"$U3M" train capacity
echo
"$U3M" train capacity --grad-accum 16
echo
# Four cards simulated together; card 1 fails and its neighbour carries two shards.
"$U3M" train sim --model llama2-13b --fail-card 1@10

section "8. RAG serving goodput per KV policy, simulated with the ascend-910b-32g profile x 4 cards (docs/serving.md)"
"$U3M" serve capacity --requests rag --model llama3-8b --policies hbm-only,u3m
echo
"$U3M" serve capacity --requests "$root/data/requests/mooncake_conversation_trace.jsonl.gz" \
  --limit 1000 --model llama3-8b --policies hbm-only,u3m

section "9. PyTorch under u3m, measured on this CPU: training with half the device memory, generation with a quarter of the KV (docs/pytorch.md)"
build=$(cd "$(dirname "$U3M")/../.." && pwd)
if [ -d "$build/python/u3m" ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  PYTHONPATH="$build/python" /usr/bin/python3 "$root/examples/train_llama_tiny.py" --compare
  echo
  PYTHONPATH="$build/python" /usr/bin/python3 "$root/examples/generate_llama_tiny.py" --compare
else
  echo "skipped: the Python extension ($build/python/u3m) or torch is missing (make build)"
fi

echo
echo "demo files in $out"
