#!/usr/bin/env bash
# Runs a local redis-server (data in .demo/redis, port 6390) and one rb-broker
# with the development certificates from `make certs`. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
REDIS_PORT=${REDIS_PORT:-6390}
mkdir -p .demo/redis
command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install -y redis-server" >&2; exit 1; }
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$PWD/.demo/redis" --appendonly yes --save "" \
  --logfile "$PWD/.demo/redis/redis.log" &
redis_pid=$!
broker_pid=
cleanup() { kill $broker_pid $redis_pid 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "redis-server on 127.0.0.1:$REDIS_PORT (appendonly, data in .demo/redis)"
# The key that seals the providers' grants in Redis (kept with the data).
[ -s .demo/grant.key ] || (umask 077 && head -c 32 /dev/urandom | base64 > .demo/grant.key)
bin/rb-broker --cert-dir .certs/broker --redis-url "redis://127.0.0.1:$REDIS_PORT/0" --grant-key-file .demo/grant.key \
  --listen-address 127.0.0.1:8443 --health-address 127.0.0.1:8081 "$@" &
broker_pid=$!
wait $broker_pid
