#!/usr/bin/env bash
# Issue 7's serving experiment on a 2x H200 machine, in one device call: builds `megamoe` with the
# server (headers carried from the dev machine by scripts/gpu_server_deps.sh), then for each MoE
# backend starts `megamoe serve` (Qwen3-30B-A3B geometry, all 48 layers, dummy FP8 weights, DP2 + EP2
# in worker processes; DP=4 / DP=8 for DP4/EP4 and DP8/EP8 on 4 / 8 GPUs), waits for /health, checks ICU's NFC through /tokenize, runs `megamoe bench
# serve` prefill-only (random 4096-token prompts, 1 output token, --ignore-eos, 128 in flight), stops
# the server. The vLLM-keyed JSON results and logs.tar.gz go to $OUT (or out/); the side-by-side table last.
#   scripts/gpu_serve.sh [build-dir]        (default /tmp/build-gpu-serve)
#   env: DP (data-parallel = expert-parallel size, default 2; needs that many GPUs), BACKENDS (default "staged mega"), NUM_PROMPTS (1024, the seed experiment), NUM_WARMUPS (16), CONCURRENCY (128),
#        INPUT_LEN (4096), BATCHED_TOKENS (--max-num-batched-tokens, 8192 = serve's and vLLM's default),
#        LAYERS (48), SKIP_BUILD=1 (warm machine, build dir already there),
#        SERVER_DEPS (folder made by gpu_server_deps.sh; default: .deps/gpu-server here or in the
#        checkout two levels up, where .xfer/<name>/ lives)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-/tmp/build-gpu-serve}
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
# NOTES: the device tool brings back at most 8 files from $OUT: the two JSON results go there, every
# log into one logs.tar.gz at the end.
logs=$(mktemp -d /tmp/gpu-serve-logs.XXXX)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/nccl_env.sh
source scripts/cudnn_env.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
summary=()
step() {  # step NAME TIMEOUT command...   (bounded; its output in $logs/NAME.log, tarred into $OUT at the end)
  local name=$1 limit=$2; shift 2; local t0=$(date +%s) rc=0
  timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ $rc = 0 ]; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($rc)|$(( $(date +%s) - t0 ))s"); tail -25 "$logs/$name.log"; fi
  return $rc
}
find_dep() {  # find_dep RELATIVE-PATH: first of ./, ../../ (the lead's checkout around .xfer/<name>/)
  for base in . ../..; do [ -e "$base/$1" ] && { (cd "$base/$1" && pwd); return 0; }; done; return 1
}
deps=${SERVER_DEPS:-$(find_dep .deps/gpu-server || true)}
frontend=${CUDNN_FRONTEND_ROOT:-$(find_dep .deps/cudnn-frontend || true)}
echo "server deps: ${deps:-MISSING} | cudnn-frontend: ${frontend:-none}"
[ "${SKIP_BUILD:-0}" = 1 ] || [ -f "$deps/pkgconfig/icu-uc.pc" ] ||
  { echo "no .deps/gpu-server: run scripts/gpu_server_deps.sh on the dev machine and carry it"; exit 1; }
export PKG_CONFIG_PATH="$deps/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# The carried .pc files link the machine's versioned runtime libraries by file name.
ls /lib/x86_64-linux-gnu/libpcre2-8.so.0 /lib/x86_64-linux-gnu/libicuuc.so.74 /lib/x86_64-linux-gnu/libicudata.so.74 2>&1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$logs/gpus.txt"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  step configure 120 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_BUILD_TESTS=OFF \
       -DMEGAMOE_REQUIRE_SERVER=ON -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" -DCUDNN_ROOT="${CUDNN_ROOT:-}" \
       -DCUDNN_FRONTEND_ROOT="${frontend:-}" || { printf '%s\n' "${summary[@]}"; exit 1; }
  grep -E "cuDNN|server|NCCL" "$logs/configure.log"
  step build 420 cmake --build "$build" -j "$(nproc)" --target megamoe_cli || { printf '%s\n' "${summary[@]}"; exit 1; }
fi
cli="$build/megamoe"
ldd "$cli" | grep -E "icu|pcre|nccl|httplib" | tee "$logs/ldd.txt"

http_get() { python3 -c "import sys,urllib.request as u;print(u.urlopen(sys.argv[1],timeout=5).read().decode())" "$1" 2>/dev/null; }
http_post() { python3 -c "import sys,urllib.request as u;r=u.Request(sys.argv[1],data=sys.argv[2].encode(),headers={'Content-Type':'application/json'});print(u.urlopen(r,timeout=10).read().decode())" "$1" "$2"; }

# The experiment's model and flags. A CPU dry run of this script's plumbing (health wait, NFC check,
# bench, stop, table) on the dev machine: SKIP_BUILD=1 MODEL=tests/fixtures/tiny-qwen3-moe
# BACKENDS="reference reference_fp32" SERVE_ARGS="--data-parallel-size 2" INPUT_LEN=64 NUM_PROMPTS=16
model=${MODEL:-tests/fixtures/qwen3-30b-a3b}
serve_args=(--load-format dummy --quantization fp8 --data-parallel-size "${DP:-2}" --enable-expert-parallel --worker-processes
            --worker-start-timeout 150 --block-size 16 --gpu-memory-utilization 0.9 --max-num-seqs 256
            --hf-overrides "{\"num_hidden_layers\": ${LAYERS:-48}}")
[ -n "${SERVE_ARGS:-}" ] && read -r -a serve_args <<<"$SERVE_ARGS"
port=8100
for backend in ${BACKENDS:-staged mega}; do
  port=$((port + 1)); url="http://127.0.0.1:$port"
  t0=$(date +%s)
  "$cli" serve "$model" --tokenizer tests/fixtures/tiny-qwen3-moe --port "$port" --moe-backend "$backend" \
      --max-num-batched-tokens "${BATCHED_TOKENS:-8192}" "${serve_args[@]}" >"$logs/serve_$backend.log" 2>&1 &
  pid=$!
  ready=0
  for _ in $(seq 1 180); do  # bounded: at most ~180 s to load and answer /health
    kill -0 "$pid" 2>/dev/null || break
    http_get "$url/health" >/dev/null && { ready=1; break; }
    sleep 1
  done
  summary+=("serve_$backend start|$([ $ready = 1 ] && echo ok || echo FAIL)|$(( $(date +%s) - t0 ))s")
  if [ $ready = 1 ]; then
    # ICU (headers edited to the machine's ICU 74) at run time: NFC makes precomposed and decomposed
    # "cafe" + acute accent the same tokens.
    a=$(http_post "$url/tokenize" '{"prompt": "caf\u00e9 na\u00efve"}')
    b=$(http_post "$url/tokenize" '{"prompt": "cafe\u0301 nai\u0308ve"}')
    ta=$(python3 -c "import json,sys;print(json.loads(sys.argv[1])['tokens'])" "$a" 2>/dev/null)
    tb=$(python3 -c "import json,sys;print(json.loads(sys.argv[1])['tokens'])" "$b" 2>/dev/null)
    echo "NFC check ($backend): precomposed $ta decomposed $tb" | tee -a "$logs/nfc.txt"
    summary+=("nfc_$backend|$([ -n "$ta" ] && [ "$ta" = "$tb" ] && echo ok || echo FAIL)|-")
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | sed "s/^/$backend serving: gpu /"
    step "bench_$backend" 240 "$cli" bench serve --base-url "$url" --tokenizer tests/fixtures/tiny-qwen3-moe \
         --dataset-name random --random-input-len "${INPUT_LEN:-4096}" --random-output-len 1 --ignore-eos \
         --num-prompts "${NUM_PROMPTS:-1024}" --num-warmups "${NUM_WARMUPS:-16}" --max-concurrency "${CONCURRENCY:-128}" \
         --request-rate inf --seed 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
         --save-result --result-dir "$out" --result-filename "serve_$backend.json" --disable-tqdm
    http_get "$url/metrics" >"$logs/metrics_$backend.txt"
  else
    tail -30 "$logs/serve_$backend.log"
  fi
  kill -INT "$pid" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -0 "$pid" 2>/dev/null && { echo "serve $backend did not stop on SIGINT: killed"; kill -KILL "$pid"; }
  wait "$pid" 2>/dev/null
  grep -E "^megamoe serve:|memory:|KV cache" "$logs/serve_$backend.log" | head -5
  # Workers exit with the front-end (socket closed, PR_SET_PDEATHSIG): the next server needs both
  # GPUs' memory back (bounded wait).
  for _ in $(seq 1 30); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break; sleep 1
  done
done

tar -czf "$out/logs.tar.gz" -C "$logs" .
echo; printf '%s\n' "${summary[@]}" | awk -F'|' '{printf "%-22s %-9s %s\n", $1, $2, $3}'
python3 - "$out" ${BACKENDS:-staged mega} <<'EOF'
import json, os, sys
out, backends = sys.argv[1], sys.argv[2:]
rows = {}
for b in backends:
    p = os.path.join(out, f"serve_{b}.json")
    if os.path.exists(p):
        rows[b] = json.load(open(p))
keys = [("completed", "{:.0f}"), ("failed", "{:.0f}"), ("duration", "{:.2f}"), ("request_throughput", "{:.2f}"),
        ("total_token_throughput", "{:.0f}"), ("mean_ttft_ms", "{:.1f}"), ("median_ttft_ms", "{:.1f}"),
        ("p99_ttft_ms", "{:.1f}")]
print("\n%-24s" % "metric" + "".join("%14s" % b[:13] for b in rows) + ("%14s" % "mega/staged" if {"staged", "mega"} <= rows.keys() else ""))
for k, f in keys:
    line = "%-24s" % k + "".join("%14s" % (f.format(r[k]) if k in r else "-") for r in rows.values())
    if {"staged", "mega"} <= rows.keys() and rows["staged"].get(k):
        line += "%14s" % "{:.3f}".format(rows["mega"][k] / rows["staged"][k])
    print(line)
EOF
