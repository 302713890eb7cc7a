#!/usr/bin/env bash
# README's first command: build, start `megamoe serve` on the built-in tiny model (committed fixture,
# no download, CPU reference backend), send it one completion, stop it.
#   scripts/demo_serve.sh [build dir] [extra cmake args...]     (default build dir: build)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
scripts/build.sh "$dir" "$@" >/dev/null
log=$(mktemp)
"$dir/megamoe" serve tests/fixtures/tiny-qwen3-moe --served-model-name tiny-qwen3-moe --port 0 \
    --moe-backend reference 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
# The server picks a free port and logs it; wait (bounded) until it answers /health.
port=""
for _ in $(seq 300); do
  port=$(sed -n 's|.* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$log" | head -1)
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "server did not start" >&2; cat "$log" >&2; exit 1; }
grep "megamoe serve:" "$log" >&2
body='{"model": "tiny-qwen3-moe", "prompt": "Question: What is 2 + 3?\nAnswer:", "max_tokens": 16, "temperature": 0}'
echo "+ curl http://127.0.0.1:$port/v1/completions -d '$body'" >&2
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' -d "$body"
echo
