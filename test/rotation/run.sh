#!/usr/bin/env bash
# The rotation check, from outside: six copies of the mlp example (MLP_DIMS=1024,4096,4096,1024,256, 128Mi each,
# a seed each) on `faas-gpu up --gpus v100x4 --gpu-memory 160Mi` (four GPUs that hold one copy each), invoked in
# three rounds; every answer must be 200 and equal the function's first answer, and the first answers must equal the
# host reference (check.py). Prints the answers' tally, the error against the reference and the pool's swaps.
# Run from the repository root after `make build functions`: test/rotation/run.sh (make check-rotation).
set -euo pipefail
cd "$(dirname "$0")/../.."
state=$(mktemp -d /tmp/faas-gpu-rotation.XXXXXX)
port=${ROTATION_PORT:-18080}
./bin/faas-gpu up --state-dir "$state" --port "$port" --nats-port "${ROTATION_NATS_PORT:-14222}" \
	--gpus v100x4 --gpu-memory 160Mi >"$state/up.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$state"' EXIT
for _ in $(seq 1 120); do grep -q '^Ready' "$state/up.log" && break; sleep 1; done
grep -q '^Ready' "$state/up.log" || { cat "$state/up.log"; exit 1; }
password=$(cat "$state/secrets/basic-auth-password")
for i in 1 2 3 4 5 6; do
	curl -sf -u "admin:$password" -H 'Content-Type: application/json' -X POST "http://127.0.0.1:$port/system/functions" \
		-d "{\"service\":\"mlp-$i\",\"image\":\"mlp:latest\",\"envVars\":{\"MLP_DIMS\":\"1024,4096,4096,1024,256\",\"MLP_SEED\":\"rot-$i\"},\"annotations\":{\"com.openfaas.gpu.memory\":\"128Mi\"}}"
done
python3 test/rotation/check.py "http://127.0.0.1:$port"
./bin/faas-gpu pool --state-dir "$state" --nats-url none | awk "NR == 1"
