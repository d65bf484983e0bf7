#!/usr/bin/env bash
# LLM scale (issue 43 item 6): wall time and peak RSS (/usr/bin/time -v) of mixprec on decoder
# LLMs in ONNX Runtime GenAI's layout, and its prefill / per-token decode latency against
# ONNX Runtime. Prints the CPU (lscpu) and the date; ratios only, no timed assertions.
#
#   a) SmolLM2-135M GenAI float32: debug precision --fp16 --decode 8 --metric tokens:1.0
#      (targets: <= 60 s, peak RSS <= 1.5x the weight bytes, model.onnx.data's size)
#   b) a TinyLlama-1.1B-shaped Llama (hidden 2048, 22 layers, 32 heads, 4 KV heads,
#      intermediate 5632, vocab 32000, untied lm_head) with seeded random weights (normal, std
#      0.02; norms ones), written by scripts/smollm2_to_onnx.py --random as external data into
#      target/llmbench/ (4.4 GB, cached; nothing committed): inspect, run --decode 4,
#      debug precision --fp16 --group roles --decode 4 --metric tokens:1.0, then a strict
#      bisect (--atol 1e9 --atol logits:0.004: all-float16 needs 0.012 on this model) to exercise
#      the search
#      (targets: each <= 30 min, under `timeout 30m`; peak RSS <= 1.5x the weights)
#   c) SmolLM2 prefill and per-token decode latency, plain export and GenAI float32, mixprec
#      against ONNX Runtime's CPU EP at the same thread count (2): `run --decode 1` (the
#      prompt) and `--decode 9` (the prompt + 8 decode steps) with --warm-up, best of 3;
#      ORT drives the same KV-cache loop (bench/llm_ort.py). Target: mixprec/ORT <= 1.2.
#
# PARTS="a c" picks parts (default: a c b); THREADS=N (default 2); MIXPREC=path of the binary
# (default: cargo build --release); LIMIT=30m the timeout of each part-b command.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${MIXPREC_PYTHON:-$(bash scripts/setup-python.sh)}
parts=${PARTS:-a c b}
threads=${THREADS:-2}
limit=${LIMIT:-30m}
if [ -n "${MIXPREC:-}" ]; then
  bin=$MIXPREC
else
  cargo build --release --quiet
  bin=${CARGO_TARGET_DIR:-target}/release/mixprec
fi
dir=target/llmbench
mkdir -p "$dir"

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')   commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "cpu:  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, family $(lscpu | sed -n 's/^CPU family: *//p')," \
  "$(grep -o -w -m1 'avx512f' /proc/cpuinfo || grep -o -w -m1 avx2 /proc/cpuinfo || echo 'no avx2')," \
  "$(free -g | awk '/^Mem:/ {print $2}') GiB;  load: $(cut -d' ' -f1-3 /proc/loadavg);  threads: $threads"

smollm2=$(MIXPREC_PYTHON=$py bash scripts/real_models.sh | sed -n 's/^derived smollm2=//p')
# A chat prompt of SmolLM2's vocabulary (16 tokens: <|im_start|>system ... <|im_start|>user ...).
prompt_ids="1,4093,198,1780,314,260,3575,282,4649,47,2,198,1,520,9531,198"
"$py" -c "import numpy as np, sys; np.savez(sys.argv[1], input_ids=np.array([[${prompt_ids}]], dtype=np.int64))" \
  "$dir/prompt.npz"

# measure NAME WEIGHT_BYTES CMD...: wall time, peak RSS and RSS / weights of one command.
measure() {
  local name=$1 weights=$2; shift 2
  local log="$dir/$name.time" rc=0
  /usr/bin/time -v "$@" >"$dir/$name.out" 2>"$log" || rc=$?
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}')
  rss=$(grep "Maximum resident set size" "$log" | awk '{print $NF}')
  local status="exit $rc"
  [ "$rc" = 124 ] && status="DID NOT FINISH in $limit"
  printf "  %-28s %-22s wall %-9s peak RSS %7.0f MB  (%.2fx weights)\n" "$name" "$status" "$wall" \
    "$(echo "$rss / 1024" | bc -l)" "$(echo "$rss * 1024 / $weights" | bc -l)"
  tail -n 2 "$dir/$name.out" | cut -c1-240 | sed 's/^/      /' || true
  if [ "$rc" != 0 ] && [ "$rc" != 124 ]; then grep -m2 -i "error" "$dir/$name.out" "$log" | sed 's/^/      /' || true; fi
}

if [[ " $parts " == *" a "* ]]; then
  model=$smollm2/genai-fp32/model.onnx
  weights=$(stat -c %s "$model.data")
  echo
  echo "(a) SmolLM2-135M GenAI float32 ($(echo "$weights / 1000000" | bc) MB of weights), 16-token prompt; targets <= 60 s, <= 1.5x weights"
  measure smollm2-fp16-decode8 "$weights" "$bin" debug precision "$model" --load-inputs "$dir/prompt.npz" \
    --fp16 --decode 8 --metric tokens:1.0 --threads "$threads"
fi

if [[ " $parts " == *" c "* ]]; then
  echo
  echo "(c) SmolLM2 latency, 16-token prompt, $threads threads, best of 3 (ms): prefill = the prompt step;"
  echo "    decode = (generate 9 - generate 1) / 8, one token through the KV cache. Target mixprec/ORT <= 1.2"
  printf "  %-12s %10s %10s %7s   %10s %10s %7s\n" model "prefill mp" "ORT" ratio "decode mp" "ORT" ratio
  for variant in plain genai-fp32; do
    model=$smollm2/$variant/model.onnx
    best() { sort -g | head -1; }
    mp1=() mp9=() ort1=() ort9=()
    for round in 1 2 3; do
      for n in 1 9; do
        # mixprec run's "Average inference time": the timed generation after --warm-up 2 (no process
        # start, no model load), in ms.
        t=$("$bin" run "$model" --load-inputs "$dir/prompt.npz" --decode $n --warm-up 2 --threads "$threads" 2>&1 |
          sed -n 's/.*Average inference time: \([0-9.]*\) ms.*/\1/p')
        t=$(echo "$t / 1000" | bc -l)
        if [ $n = 1 ]; then mp1+=("$t"); else mp9+=("$t"); fi
      done
      read -r o1 o9 < <("$py" bench/llm_ort.py "$model" "$prompt_ids" "$threads")
      ort1+=("$o1") ort9+=("$o9")
    done
    m1=$(printf '%s\n' "${mp1[@]}" | best) m9=$(printf '%s\n' "${mp9[@]}" | best)
    r1=$(printf '%s\n' "${ort1[@]}" | best) r9=$(printf '%s\n' "${ort9[@]}" | best)
    "$py" - "$variant" "$m1" "$m9" "$r1" "$r9" <<'PY'
import sys
name, m1, m9, r1, r9 = sys.argv[1], *map(float, sys.argv[2:])
mp_pre, mp_dec = m1 * 1e3, (m9 - m1) * 1e3 / 8
ort_pre, ort_dec = r1 * 1e3, (r9 - r1) * 1e3 / 8
print(f"  {name:<12} {mp_pre:10.1f} {ort_pre:10.1f} {mp_pre / ort_pre:7.2f}   {mp_dec:10.2f} {ort_dec:10.2f} {mp_dec / ort_dec:7.2f}")
PY
  done
fi

if [[ " $parts " == *" b "* ]]; then
  big=$dir/tinyllama-1.1b-random
  cat >"$dir/tinyllama-1.1b.json" <<'JSON'
{"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
 "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048, "rope_theta": 10000.0,
 "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": false}
JSON
  key=$(cat scripts/smollm2_to_onnx.py "$dir/tinyllama-1.1b.json" | sha256sum | cut -c1-16)
  if [ "$(cat "$big/.key" 2>/dev/null)" != "$key" ]; then
    echo
    echo "writing $big (scripts/smollm2_to_onnx.py --random, seed 0; 4.4 GB) ..."
    rm -rf "$big"
    /usr/bin/time -f "  generated in %e s, peak RSS %M KB" "$py" scripts/smollm2_to_onnx.py --random \
      "$dir/tinyllama-1.1b.json" 0 "$big"
    echo "$key" >"$big/.key"
  fi
  model=$big/genai-fp32/model.onnx
  weights=$(stat -c %s "$model.data")
  echo
  echo "(b) TinyLlama-1.1B-shaped, random weights ($(echo "$weights / 1000000" | bc) MB), 16-token prompt;" \
    "targets: each <= 30 min, <= 1.5x weights"
  measure big-inspect "$weights" timeout "$limit" "$bin" inspect "$model"
  measure big-run-decode4 "$weights" timeout "$limit" "$bin" run "$model" --load-inputs "$dir/prompt.npz" \
    --decode 4 --threads "$threads"
  measure big-fp16-roles-tokens "$weights" timeout "$limit" "$bin" debug precision "$model" \
    --load-inputs "$dir/prompt.npz" --fp16 --group roles --decode 4 --metric tokens:1.0 --threads "$threads"
  measure big-fp16-roles-logits "$weights" timeout "$limit" "$bin" debug precision "$model" \
    --load-inputs "$dir/prompt.npz" --fp16 --group roles --decode 4 --mode bisect \
    --atol 1e9 --atol "logits:${LOGITS_ATOL:-0.004}" --threads "$threads"
fi
