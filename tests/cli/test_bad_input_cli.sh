#!/usr/bin/env bash
# The bad-input sweep of every u3m command (docs/reliability.md): each bad
# value, missing or broken file ends in exit 2 and one stderr line that names
# the flag, file or field; never a crash, a hang (every run has a timeout) or
# a silent success. Part of it is generated: every numeric flag that
# `COMMAND --help` lists is given values no flag may take (not a number, NaN,
# infinities, overflow, a negative count, empty). The rest are cases that
# need the flag's meaning (0 where a count must be positive, sizes past the
# limit, out-of-range fractions, files that are missing, directories, empty,
# truncated or corrupt).
#
# SWEEP_ONLY=a,b limits the sweep to those commands (e.g. "serve sim").
# Commands owned elsewhere (predict, trace import, bench copy/ssd, doctor)
# are swept with SWEEP_ALL=1 only; `run replay --host-budget` is skipped
# (a known hang the engine fixes).
source "$(dirname "$0")/lib.sh"
WANT_RC=2
SRC=${U3M_SOURCE_DIR:?U3M_SOURCE_DIR not set}
T=${SWEEP_TIMEOUT:-30}

# --- fixtures: a tiny trace, a request trace, broken copies of each
"$U3M" trace gen --model tiny --workload train --steps 2 -o "$tmp/t.u3mt" >/dev/null 2>"$tmp/err" ||
  { echo "FAIL: trace gen: $(cat "$tmp/err")"; exit 1; }
"$U3M" trace convert "$tmp/t.u3mt" -o "$tmp/t.jsonl" >/dev/null 2>&1
"$U3M" requests gen rag -o "$tmp/r.jsonl" --requests 8 >/dev/null 2>"$tmp/err" ||
  { echo "FAIL: requests gen: $(cat "$tmp/err")"; exit 1; }
: >"$tmp/empty"
mkdir -p "$tmp/dir"
head -c 200 "$tmp/t.u3mt" >"$tmp/cut.u3mt"
head -c 150 "$tmp/t.jsonl" >"$tmp/cut.jsonl"
cp "$tmp/t.u3mt" "$tmp/flip.u3mt"
printf '\xff\xff\xff\xff' | dd of="$tmp/flip.u3mt" bs=1 seek=300 conv=notrunc 2>/dev/null
head -c 300 "$tmp/r.jsonl" >"$tmp/cut-r.jsonl"
printf 'not a trace at all\n' >"$tmp/junk.txt"
printf '[device]\nname = "x"\nhbm_capacity = \n' >"$tmp/bad.toml"
printf '\x1f\x8b\x08\x00junk' >"$tmp/bad.gz"
NOFILE="$tmp/no/such/file"
NOTDIR="$tmp/empty/x"  # a path below a regular file: ENOTDIR

# run_bad NAME WANT CMD...: the command under a timeout, as expect_error wants.
run_bad() {
  local name=$1 want=$2; shift 2
  expect_error "$name" "$want" timeout -k 5 "$T" "$@"
}

# --- the generated part: numeric flags from --help, values none may take.
declare -A BASE=(
  ["trace gen"]="--model tiny --workload train --steps 2 -o $tmp/g.u3mt"
  ["mem plan"]="$tmp/t.u3mt"
  ["bench alloc"]="--seconds 0.05 --rounds 1 --sizes 4K"
  ["hw calibrate"]="-o $tmp/hw.toml --seconds 0.2 --dir $tmp"
  ["requests import"]="$tmp/r.jsonl -o $tmp/ri.jsonl"
  ["requests gen rag"]="-o $tmp/rg.jsonl --requests 8"
  ["requests stats"]="$tmp/r.jsonl"
  ["run replay"]="$tmp/t.u3mt"
  ["train sim"]="--model tiny --cards 1"
  ["train capacity"]="--policies hbm-only --cards 1"
  ["train check"]="--calibrate-seconds 0.2"
  ["serve sim"]="--requests rag:requests=5 --model tiny"
  ["serve capacity"]="--requests rag:requests=5 --model tiny --policies hbm-only"
)
if [ -n "${SWEEP_ALL:-}" ]; then
  BASE["predict eval"]="$tmp/t.u3mt"
  BASE["trace import"]="$SRC/data/pytorch-et/linear_et.json.gz -o $tmp/i.u3mt"
  BASE["trace stats"]="$tmp/t.u3mt"
  BASE["bench copy"]="--seconds 0.05 --rounds 1 --sizes 4K"
  BASE["bench ssd"]="--seconds 0.05 --sizes 4K --dir $tmp"
fi
in_scope() {
  [ -z "${SWEEP_ONLY:-}" ] && return 0
  local IFS=,
  for c in $SWEEP_ONLY; do [ "$c" = "$1" ] && return 0; done
  return 1
}

for cmd in "${!BASE[@]}"; do
  in_scope "$cmd" || continue
  # "  --flag UINT=1 text" or "  -o,--output TEXT ...": the long name and its type.
  # shellcheck disable=SC2086
  "$U3M" $cmd --help 2>/dev/null |
    sed -nE 's/^ +(-[a-z],)?(--[a-z0-9-]+) +(UINT|INT|FLOAT)\b.*/\2 \3/p' >"$tmp/flags"
  [ -s "$tmp/flags" ] || { bad "$cmd --help lists no numeric flags"; continue; }
  while read -r flag type; do
    [ "$cmd $flag" = "run replay --host-budget" ] && continue
    # (The checks are one validator per type, Note [Numeric flags]; the rarer
    # spellings are tried once below, to keep the sweep short.)
    case $type in
      UINT) vals=(abc "" -1 99999999999999999999999) ;;
      INT) vals=(abc "" 99999999999999999999999) ;;
      FLOAT) vals=(abc "" nan inf) ;;
    esac
    for v in "${vals[@]}"; do
      # shellcheck disable=SC2086
      run_bad "$cmd $flag '$v'" "$flag" "$U3M" $cmd ${BASE[$cmd]} "$flag" "$v"
    done
  done <"$tmp/flags"
done

if in_scope "serve sim"; then
  for v in -inf 1e999 1.5x 0x10; do run_bad "serve sim --rate-scale '$v'" "--rate-scale" "$U3M" serve sim --requests rag:requests=5 --model tiny --rate-scale "$v"; done
  for v in nan 1.5x 1e3 +3; do run_bad "serve sim --cards '$v'" "--cards" "$U3M" serve sim --requests rag:requests=5 --model tiny --cards "$v"; done
fi

# --- the cases that need each flag's meaning
case_of() { in_scope "$1"; }

if case_of "trace gen"; then
  G=("$U3M" trace gen --model tiny --workload train -o "$tmp/g.u3mt")
  for f in --steps --micro-batches --batch --seq-len --zero3-ranks; do run_bad "trace gen $f 0" "$f" "${G[@]}" $f 0; done
  run_bad "trace gen --lora-rank huge" "--lora-rank" "${G[@]}" --lora-rank 70000
  run_bad "trace gen --lora-targets" "--lora-targets" "${G[@]}" --lora-rank 4 --lora-targets q,zz
  run_bad "trace gen --lora-targets empty" "--lora-targets" "${G[@]}" --lora-rank 4 --lora-targets ""
  run_bad "trace gen batch x seq" "--batch" "${G[@]}" --batch 4000000 --seq-len 4000
  run_bad "trace gen --model" "--model" "${G[@]}" --model nope
  run_bad "trace gen --heads" "--heads" "${G[@]}" --layers 2 --d-model 64 --heads 5 --kv-heads 1 --ffn 64 --vocab 64
  run_bad "trace gen --layers 0" "--layers" "${G[@]}" --layers 0 --d-model 64 --heads 4 --kv-heads 1 --ffn 64 --vocab 64
  I=("$U3M" trace gen --model tiny --workload infer -o "$tmp/g.u3mt")
  for f in --block-tokens --max-batch --max-prefill-tokens --requests; do run_bad "trace gen infer $f 0" "$f" "${I[@]}" $f 0; done
  run_bad "trace gen --prompt-len" "--prompt-len" "${I[@]}" --prompt-len fixed:0
  run_bad "trace gen --output-len" "--output-len" "${I[@]}" --output-len uniform:9:3
  for f in --arrival-rate --peak-tflops --hbm-gbps --link-gbps; do
    run_bad "trace gen $f 0" "$f" "${I[@]}" $f 0
    run_bad "trace gen $f -1" "$f" "${I[@]}" $f -1
  done
  run_bad "trace gen --op-overhead-us -1" "--op-overhead-us" "${I[@]}" --op-overhead-us -1
  M=("$U3M" trace gen --model tiny --workload mixed -o "$tmp/g.u3mt")
  for f in --rounds --rollout-batch --max-new-tokens; do run_bad "trace gen mixed $f 0" "$f" "${M[@]}" $f 0; done
  G0=("$U3M" trace gen --model tiny --workload train)
  run_bad "trace gen -o missing dir" "$NOFILE" "${G0[@]}" -o "$NOFILE"
  run_bad "trace gen -o a directory" "$tmp/dir" "${G0[@]}" -o "$tmp/dir"
  run_bad "trace gen --summary-json missing dir" "$NOFILE" "${G[@]}" --summary-json "$NOFILE"
fi

# Trace inputs every trace-reading command must refuse, and what each names.
trace_inputs() {  # CMD... (the trace is appended)
  run_bad "$* missing" "$NOFILE" "$@" "$NOFILE"
  run_bad "$* directory" "$tmp/dir" "$@" "$tmp/dir"
  run_bad "$* empty" "$tmp/empty" "$@" "$tmp/empty"
  run_bad "$* not a dir" "$NOTDIR" "$@" "$NOTDIR"
  run_bad "$* truncated binary" "cut.u3mt" "$@" "$tmp/cut.u3mt"
  run_bad "$* truncated jsonl" "cut.jsonl" "$@" "$tmp/cut.jsonl"
  run_bad "$* corrupt binary" "flip.u3mt" "$@" "$tmp/flip.u3mt"
  run_bad "$* junk" "junk.txt" "$@" "$tmp/junk.txt"
  run_bad "$* bad gzip" "bad.gz" "$@" "$tmp/bad.gz"
}

# --config FILE (docs/config.md): each defect is refused naming the file, the
# line and the key.
printf '[tiers.device]\nhigh_watermak = 0.9\n' >"$tmp/cfg-key.toml"
printf '[policy]\ntiering = 3\n' >"$tmp/cfg-type.toml"
printf '[tiers.host]\nhigh_watermark = 0.7\nlow_watermark = 0.8\n' >"$tmp/cfg-order.toml"
printf '\n[policy]\ntiering = "fifo"\n' >"$tmp/cfg-name.toml"
printf '[tiers.device\n' >"$tmp/cfg-syntax.toml"
config_inputs() {  # CMD... (--config FILE is appended)
  run_bad "$* --config unknown key" "cfg-key.toml:2: unknown key 'high_watermak' in [tiers.device]" "$@" --config "$tmp/cfg-key.toml"
  run_bad "$* --config wrong type" "cfg-type.toml:2: 'policy.tiering' must be a string" "$@" --config "$tmp/cfg-type.toml"
  run_bad "$* --config watermarks" "cfg-order.toml:3: 'tiers.host.low_watermark'" "$@" --config "$tmp/cfg-order.toml"
  run_bad "$* --config unknown name" "cfg-name.toml:3: 'policy.tiering': unknown policy 'fifo'" "$@" --config "$tmp/cfg-name.toml"
  run_bad "$* --config syntax" "cfg-syntax.toml:1: TOML syntax" "$@" --config "$tmp/cfg-syntax.toml"
  run_bad "$* --config missing" "--config" "$@" --config "$NOFILE"
}

if case_of "mem plan"; then
  trace_inputs "$U3M" mem plan
  P=("$U3M" mem plan "$tmp/t.u3mt")
  run_bad "mem plan --samples 0" "--samples" "${P[@]}" --samples 0
  run_bad "mem plan --pool-config" "--pool-config" "${P[@]}" --pool-config alignment:3
  run_bad "mem plan --pool-config key" "--pool-config" "${P[@]}" --pool-config nope:1
  run_bad "mem plan --pool-config size" "--pool-config" "${P[@]}" --pool-config capacity:99999999999999999999GiB
  run_bad "mem plan --offsets missing dir" "$NOFILE" "${P[@]}" --offsets "$NOFILE"
  run_bad "mem plan --offsets a directory" "$tmp/dir" "${P[@]}" --offsets "$tmp/dir"
fi

if case_of "run replay"; then
  trace_inputs "$U3M" run replay
  R=("$U3M" run replay "$tmp/t.u3mt")
  for v in 0 -0.5 1.5 nan; do run_bad "run replay --device-fraction $v" "--device-fraction" "${R[@]}" --device-fraction "$v"; done
  for f in --device-budget --ssd-size; do
    for v in 0 -1 abc 4X 2T 99999999999999999999 ""; do run_bad "run replay $f '$v'" "$f" "${R[@]}" $f "$v"; done
  done
  run_bad "run replay --h2d-gbps -1" "--h2d-gbps" "${R[@]}" --h2d-gbps -1
  run_bad "run replay --d2h-gbps -1" "--d2h-gbps" "${R[@]}" --d2h-gbps -1
  run_bad "run replay --ssd-dir missing" "--ssd-dir" "${R[@]}" --ssd-dir "$NOFILE"
  run_bad "run replay --ssd-dir a file" "--ssd-dir" "${R[@]}" --ssd-dir "$tmp/empty"
  run_bad "run replay --hw without --diagnose" "--hw" "${R[@]}" --hw ascend-910b-32g
  run_bad "run replay --diagnose --hw unknown" "nope" "${R[@]}" --diagnose --hw nope
  run_bad "run replay --diagnose --hw bad" "bad.toml" "${R[@]}" --diagnose --hw "$tmp/bad.toml"
  config_inputs "${R[@]}"
fi

if case_of "bench alloc"; then
  B=("$U3M" bench alloc --seconds 0.05 --rounds 1)
  for v in 0 "" , 4K, 1X -1 99999999999999999999; do run_bad "bench alloc --sizes '$v'" "--sizes" "${B[@]}" --sizes "$v"; done
  for v in 0 -1; do run_bad "bench alloc --rounds $v" "--rounds" "${B[@]}" --sizes 4K --rounds "$v"; done
  for v in 0 -1 1e9; do run_bad "bench alloc --seconds $v" "--seconds" "${B[@]}" --sizes 4K --seconds "$v"; done
  run_bad "bench alloc --pool-config" "--pool-config" "${B[@]}" --sizes 4K --pool-config alignment:0
fi

if case_of "hw show"; then
  run_bad "hw show unknown" "nope" "$U3M" hw show nope
  run_bad "hw show missing file" "$NOFILE" "$U3M" hw show "$NOFILE.toml"
  run_bad "hw show directory" "$tmp/dir" "$U3M" hw show "$tmp/dir"
  run_bad "hw show empty" "empty" "$U3M" hw show "$tmp/empty"
  run_bad "hw show bad toml" "bad.toml" "$U3M" hw show "$tmp/bad.toml"
  run_bad "hw show junk" "junk.txt" "$U3M" hw show "$tmp/junk.txt"
fi

if case_of "hw calibrate"; then
  C=("$U3M" hw calibrate -o "$tmp/hw.toml" --dir "$tmp")
  for v in 0 -1 1e9; do run_bad "hw calibrate --seconds $v" "--seconds" "${C[@]}" --seconds "$v"; done
  for v in 0 -1 4X ""; do run_bad "hw calibrate --hbm-capacity '$v'" "--hbm-capacity" "${C[@]}" --seconds 0.2 --hbm-capacity "$v"; done
  run_bad "hw calibrate --dir missing" "$NOFILE" "$U3M" hw calibrate -o "$tmp/hw.toml" --seconds 0.2 --dir "$NOFILE"
  run_bad "hw calibrate --dir a file" "$tmp/empty" "$U3M" hw calibrate -o "$tmp/hw.toml" --seconds 0.2 --dir "$tmp/empty"
  run_bad "hw calibrate -o missing dir" "$NOFILE" "$U3M" hw calibrate -o "$NOFILE" --seconds 0.2 --dir "$tmp"
fi

# Request-trace inputs (requests import/stats, --arrivals-from, serve --requests).
request_inputs() {  # CMD... (the file is appended)
  run_bad "$* missing" "$NOFILE" "$@" "$NOFILE"
  run_bad "$* directory" "$tmp/dir" "$@" "$tmp/dir"
  run_bad "$* empty" "$tmp/empty" "$@" "$tmp/empty"
  run_bad "$* not a dir" "$NOTDIR" "$@" "$NOTDIR"
  run_bad "$* truncated" "cut-r.jsonl" "$@" "$tmp/cut-r.jsonl"
  run_bad "$* junk" "junk.txt" "$@" "$tmp/junk.txt"
  run_bad "$* bad gzip" "bad.gz" "$@" "$tmp/bad.gz"
}

if case_of "requests import"; then
  request_inputs "$U3M" requests import -o "$tmp/ri.jsonl"
  run_bad "requests import --mooncake-block-tokens 0" "--mooncake-block-tokens" "$U3M" requests import "$tmp/r.jsonl" -o "$tmp/ri.jsonl" --mooncake-block-tokens 0
  run_bad "requests import --format" "--format" "$U3M" requests import "$tmp/r.jsonl" -o "$tmp/ri.jsonl" --format csv
  run_bad "requests import -o missing dir" "$NOFILE" "$U3M" requests import "$tmp/r.jsonl" -o "$NOFILE"
  run_bad "requests import -o a directory" "$tmp/dir" "$U3M" requests import "$tmp/r.jsonl" -o "$tmp/dir"
fi

if case_of "requests stats"; then
  request_inputs "$U3M" requests stats
  for v in 0 , 5, abc -1 99999999999999999999999; do run_bad "requests stats --cache-tokens '$v'" "--cache-tokens" "$U3M" requests stats "$tmp/r.jsonl" --cache-tokens "$v"; done
fi

if case_of "requests gen rag"; then
  Q=("$U3M" requests gen rag -o "$tmp/rg.jsonl" --requests 8)
  run_bad "rag --corpus 0" "--corpus" "${Q[@]}" --corpus 0
  run_bad "rag --corpus huge" "--corpus" "${Q[@]}" --corpus 4000000000
  run_bad "rag --passages > corpus" "--passages" "${Q[@]}" --corpus 3 --passages 4
  run_bad "rag --requests huge" "--requests" "${Q[@]}" --requests 4000000000
  run_bad "rag --system-tokens huge" "--turns" "${Q[@]}" --system-tokens 4294967295
  for v in 0 -1; do run_bad "rag --rate $v" "--rate" "${Q[@]}" --rate "$v"; done
  run_bad "rag --zipf -1" "--zipf" "${Q[@]}" --zipf -1
  run_bad "rag --turns 0" "--turns" "${Q[@]}" --turns 0
  for v in -0.1 1.1; do run_bad "rag --followup-prob $v" "--followup-prob" "${Q[@]}" --followup-prob "$v"; done
  for f in --passage-len --question-len --output-len; do
    for v in fixed:0 uniform:5:2 lognormal:0:1:5 "" fixed:2000000000 nope; do run_bad "rag $f '$v'" "$f" "${Q[@]}" $f "$v"; done
  done
  run_bad "rag --passage-order" "--passage-order" "${Q[@]}" --passage-order random
  request_inputs "${Q[@]}" --arrivals-from
  run_bad "rag -o missing dir" "$NOFILE" "$U3M" requests gen rag -o "$NOFILE" --requests 8
  run_bad "rag --system-prompts 0" "--system-prompts" "${Q[@]}" --system-prompts 0
  run_bad "rag --topics huge" "--topics" "${Q[@]}" --topics 4000000000
  for f in --topic-zipf --rank-noise --system-zipf; do run_bad "rag $f -1" "$f" "${Q[@]}" $f -1; done
fi

# Scenario flags train sim and train capacity share.
train_scenario() {  # CMD... (a valid base)
  for f in --cards --micro-batch --seq --grad-accum; do run_bad "$* $f 0" "$f" "$@" $f 0; done
  run_bad "$* --steps 1" "--steps" "$@" --steps 1
  run_bad "$* --lora-rank huge" "--lora-rank" "$@" --lora-rank 70000
  run_bad "$* batch x seq" "--micro-batch" "$@" --micro-batch 4000000 --seq 4000
  run_bad "$* --hw unknown" "nope" "$@" --hw nope
  run_bad "$* --hw missing" "$NOFILE" "$@" --hw "$NOFILE.toml"
  run_bad "$* --hw directory" "$tmp/dir" "$@" --hw "$tmp/dir"
  run_bad "$* --hw bad" "bad.toml" "$@" --hw "$tmp/bad.toml"
  run_bad "$* --card-model" "--card-model" "$@" --card-model odd
  run_bad "$* --prefetch" "--prefetch" "$@" --prefetch soon
  run_bad "$* --recalibrate" "--recalibrate" "$@" --recalibrate maybe
  for v in -1 1e10; do run_bad "$* --recalibrate-period $v" "--recalibrate-period" "$@" --recalibrate-period "$v"; done
  run_bad "$* unknown flag" "--seq-len" "$@" --seq-len 0
}

if case_of "train sim"; then
  S=("$U3M" train sim --model tiny --cards 1)
  train_scenario "${S[@]}"
  run_bad "train sim --model" "--model" "${S[@]}" --model nope
  run_bad "train sim --policy" "--policy" "${S[@]}" --policy fifo
  for v in "" 1 x@1 1@ @1 0@0 5@1 -1@1 1@-1; do run_bad "train sim --fail-card '$v'" "--fail-card" "$U3M" train sim --model tiny --cards 2 --fail-card "$v"; done
  run_bad "train sim --fail-card one card" "--fail-card" "${S[@]}" --fail-card 0@1
  config_inputs "${S[@]}"
fi

if case_of "train capacity"; then
  K=("$U3M" train capacity --policies hbm-only --cards 1)
  train_scenario "${K[@]}"
  for v in -0.1 1 nan; do run_bad "train capacity --max-loss $v" "--max-loss" "${K[@]}" --max-loss "$v"; done
  for v in "" fifo hbm-only, ,lru; do run_bad "train capacity --policies '$v'" "--policies" "$U3M" train capacity --cards 1 --policies "$v"; done
fi

if case_of "train check"; then
  H=("$U3M" train check)
  run_bad "train check --hw missing" "$NOFILE" "${H[@]}" --hw "$NOFILE"
  run_bad "train check --hw directory" "$tmp/dir" "${H[@]}" --hw "$tmp/dir"
  run_bad "train check --hw bad" "bad.toml" "${H[@]}" --hw "$tmp/bad.toml"
  for v in 0 -1; do
    run_bad "train check --calibrate-seconds $v" "--calibrate-seconds" "${H[@]}" --calibrate-seconds "$v"
  done
  run_bad "train check --compute-scale -1" "--compute-scale" "${H[@]}" --compute-scale -1
  for v in 0 4 12; do run_bad "train check --check-stride $v" "--check-stride" "${H[@]}" --check-stride "$v"; done
  run_bad "train check --dir missing" "$NOFILE" "${H[@]}" --dir "$NOFILE"
fi

# Serving flags serve sim and serve capacity share.
serve_common() {  # CMD... (a valid base without --requests)
  local R=(--requests rag:requests=5)
  run_bad "$* --cards 0" "--cards" "$@" "${R[@]}" --cards 0
  run_bad "$* --block-tokens 0" "--block-tokens" "$@" "${R[@]}" --block-tokens 0
  run_bad "$* --block-tokens huge" "--block-tokens" "$@" "${R[@]}" --block-tokens 4000000000
  run_bad "$* --max-batch-tokens 0" "--max-batch-tokens" "$@" "${R[@]}" --max-batch-tokens 0
  for v in 0 9 -1 2.5 abc; do run_bad "$* --instances $v" "--instances" "$@" "${R[@]}" --instances "$v"; done
  for v in pooled "" SHARED; do run_bad "$* --pool '$v'" "--pool" "$@" "${R[@]}" --pool "$v"; done
  for v in 0 1.5 -1; do run_bad "$* --meet-fraction $v" "--meet-fraction" "$@" "${R[@]}" --meet-fraction "$v"; done
  for f in --slo-ttft-ms --slo-tpot-ms; do run_bad "$* $f -1" "$f" "$@" "${R[@]}" $f -1; done
  run_bad "$* --slo-ttft-factor -2" "--slo-ttft-factor" "$@" "${R[@]}" --slo-ttft-factor -2
  run_bad "$* --model" "--model" "$@" "${R[@]}" --model nope
  run_bad "$* --hw unknown" "nope" "$@" "${R[@]}" --hw nope
  run_bad "$* --hw bad" "bad.toml" "$@" "${R[@]}" --hw "$tmp/bad.toml"
  for v in -1 nan inf abc; do run_bad "$* --ssd-dwpd $v" "--ssd-dwpd" "$@" "${R[@]}" --ssd-dwpd "$v"; done
  for v in -0.1 1.5 nan abc; do run_bad "$* --blend-recompute $v" "--blend-recompute" "$@" "${R[@]}" --blend-recompute "$v"; done
  for f in --ssd-admit-after --sched-bypass; do
    for v in -1 2.5 abc 99999999999; do run_bad "$* $f $v" "$f" "$@" "${R[@]}" $f "$v"; done
  done
  request_inputs "$@" --requests
  run_bad "$* not rag, not a file" "ragx" "$@" --requests ragx
  run_bad "$* rag no =" "--requests" "$@" --requests rag:requests
  run_bad "$* rag key" "colour" "$@" --requests rag:colour=blue
  run_bad "$* rag empty item" "--requests" "$@" --requests rag:requests=5,
  for k in requests system corpus passages turns seed; do
    for v in -1 abc "" 1.5 99999999999999999999999; do run_bad "$* rag:$k='$v'" "rag:$k" "$@" --requests "rag:$k=$v"; done
  done
  for k in rate zipf; do
    for v in nan inf -1 abc ""; do run_bad "$* rag:$k='$v'" "rag:$k" "$@" --requests "rag:$k=$v"; done
  done
  run_bad "$* rag:rate=0" "rag:rate" "$@" --requests rag:rate=0
  run_bad "$* rag:corpus=0" "rag:corpus" "$@" --requests rag:corpus=0
  run_bad "$* rag:corpus huge" "rag:corpus" "$@" --requests rag:corpus=4000000000
  run_bad "$* rag:requests huge" "rag:requests" "$@" --requests rag:requests=4000000000
  run_bad "$* rag:passages > corpus" "rag:passages" "$@" --requests rag:corpus=2,passages=3
  run_bad "$* rag:turns=0" "rag:turns" "$@" --requests rag:turns=0
  run_bad "$* rag:order" "rag:order" "$@" --requests rag:order=random
  run_bad "$* rag:passage-len" "rag:passage-len" "$@" --requests rag:passage-len=fixed:0
  run_bad "$* rag:system huge" "rag:turns" "$@" --requests rag:system=4294967295
  for k in topics system-prompts; do
    for v in -1 abc "" 1.5 99999999999999999999999; do run_bad "$* rag:$k='$v'" "rag:$k" "$@" --requests "rag:$k=$v"; done
  done
  for k in topic-zipf rank-noise system-zipf; do
    for v in nan inf -1 abc ""; do run_bad "$* rag:$k='$v'" "rag:$k" "$@" --requests "rag:$k=$v"; done
  done
  run_bad "$* rag:system-prompts=0" "rag:system-prompts" "$@" --requests rag:system-prompts=0
  run_bad "$* rag:system-prompts huge" "rag:system-prompts" "$@" --requests rag:system-prompts=4000000
  run_bad "$* rag:topics huge" "rag:topics" "$@" --requests rag:topics=4000000000
}

if case_of "serve sim"; then
  V=("$U3M" serve sim --model tiny)
  serve_common "${V[@]}"
  for v in 0 -1; do run_bad "serve sim --rate-scale $v" "--rate-scale" "${V[@]}" --requests rag:requests=5 --rate-scale "$v"; done
  run_bad "serve sim --kv-policy" "--kv-policy" "${V[@]}" --requests rag:requests=5 --kv-policy fifo
  run_bad "serve sim --timeline unwritable" "--timeline" "${V[@]}" --requests rag:requests=5 --timeline "$NOFILE/t.json"
  run_bad "serve sim --timeline with --instances 2" "--timeline" "${V[@]}" --requests rag:requests=5 --instances 2 --timeline "$tmp/t.json"
  config_inputs "${V[@]}" --requests rag:requests=5
fi

if case_of "serve capacity"; then
  W=("$U3M" serve capacity --model tiny --policies hbm-only)
  serve_common "${W[@]}"
  for v in "" fifo hbm-only, ,u3m; do run_bad "serve capacity --policies '$v'" "--policies" "$U3M" serve capacity --model tiny --requests rag:requests=5 --policies "$v"; done
fi

# --- the command line itself
if case_of "command line"; then
  run_bad "no command" "needs a command" "$U3M"
  run_bad "unknown command" "'bogus'" "$U3M" bogus
  run_bad "unknown subcommand" "'bogus'" "$U3M" serve bogus
  run_bad "no subcommand" "'u3m serve' needs a command" "$U3M" serve
  run_bad "unknown flag" "--no-such-flag" "$U3M" serve sim --requests rag --no-such-flag
  run_bad "missing value" "--cards" "$U3M" serve sim --requests rag --cards
  run_bad "required flag" "--requests" "$U3M" serve sim
  run_bad "required positional" "input" "$U3M" requests import -o "$tmp/x.jsonl"
  "$U3M" --version >"$tmp/out" 2>&1 && grep -q "u3m 0" "$tmp/out" && ok || bad "--version: exit or text"
  "$U3M" serve sim --help >"$tmp/out" 2>&1 && grep -q "Usage" "$tmp/out" && ok || bad "serve sim --help"
fi

finish "cli bad input"
