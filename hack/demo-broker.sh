#!/usr/bin/env bash
# The broker demo: Redis, one rb-broker over mutual TLS, and three clusters
# (rome, paris, berlin) talking to it with their own client certificates.
# The clusters here are played by curl (make demo-broker); the three-cluster
# demo with real agents, the scheduler and virtual nodes is make demo
# (hack/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
REDIS_PORT=${REDIS_PORT:-6390}
BROKER=https://127.0.0.1:8443
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
pretty() { if command -v jq >/dev/null; then jq .; else cat; echo; fi; }
as() { # as <cluster> <curl args...>
  local c=$1; shift
  curl -sS --cacert .certs/broker/ca.crt --cert ".certs/clusters/$c/tls.crt" --key ".certs/clusters/$c/tls.key" "$@"
}

rm -rf .demo/redis && mkdir -p .demo
bin/rbctl certs --out .certs --clusters rome,paris,berlin >/dev/null
say "starting redis-server (127.0.0.1:$REDIS_PORT) and rb-broker ($BROKER, health on :8081)"
hack/run-broker.sh --v=1 >.demo/broker.log 2>&1 &
broker_pid=$!
trap 'kill $broker_pid 2>/dev/null; wait $broker_pid 2>/dev/null || true; echo; echo "stopped (logs in .demo/)"; exit 0' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:8081/readyz >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf http://127.0.0.1:8081/readyz >/dev/null || { echo "broker not ready; see .demo/broker.log" >&2; exit 1; }

advertise() { # advertise <cluster> <cpu> <memory> <gpu> <price per core-hour> <region>
  as "$1" -X PUT "$BROKER/api/v2/clusters/$1/advertisement" -d '{
    "clusterName":"'"$1"'","endpoint":"https://'"$1"'.example:6443","labels":{"region":"'"$6"'"},
    "resources":{"capacity":{"cpu":"'"$2"'","memory":"'"$3"'","gpu":"'"$4"'"},
                 "allocatable":{"cpu":"'"$2"'","memory":"'"$3"'","gpu":"'"$4"'"},
                 "allocated":{"cpu":"1","memory":"2Gi"}},
    "prices":{"currency":"EUR","cpu":"'"$5"'","memory":"0.004","gpu":"0.90"}}' >/dev/null
  echo "$1 advertised: cpu $2, memory $3, gpu $4, $5 EUR per core-hour, region $6"
}
say "three clusters advertise themselves (each with its own client certificate)"
advertise rome 4 16Gi 0 0.040 eu-south
advertise paris 32 128Gi 0 0.028 eu-west
advertise berlin 64 256Gi 4 0.035 eu-central

say "rome asks for 4 CPU / 8Gi: scoring prefers the cheaper paris"
as rome -X POST "$BROKER/api/v2/reservations" -d '{"id":"demo-web","resources":{"cpu":"4","memory":"8Gi"},"duration":"10m","owner":"default/web-0"}' | pretty
say "rome asks for a GPU: only berlin has one"
as rome -X POST "$BROKER/api/v2/reservations" -d '{"id":"demo-train","resources":{"cpu":"8","memory":"32Gi","gpu":"1"},"owner":"ml/train-0"}' | pretty
say "rome asks for 200 CPU: nothing fits (409, with the reason per class of cluster)"
as rome -X POST "$BROKER/api/v2/reservations" -d '{"id":"demo-huge","resources":{"cpu":"200","memory":"8Gi"}}' | pretty
say "paris may not read rome's reservation to berlin: 404, as for an id that does not exist"
as paris "$BROKER/api/v2/reservations/demo-train?requester=rome" | pretty
say "the seed agents' v1 protocol works unchanged: paris polls its provider instructions"
as paris "$BROKER/api/v1/instructions" | pretty
say "rome releases demo-web; paris's capacity comes back"
as rome -X DELETE "$BROKER/api/v2/reservations/demo-web" | pretty

cat <<MSG

Look around while it runs:
  redis-cli -p $REDIS_PORT --scan --pattern 'rb:*'
  redis-cli -p $REDIS_PORT HGETALL 'rb:{b}:cluster:berlin'
  redis-cli -p $REDIS_PORT HGETALL 'rb:{b}:resv:demo-train'
  redis-cli -p $REDIS_PORT XRANGE 'rb:{b}:audit' - +
  curl -s http://127.0.0.1:8081/metrics | grep rb_broker_
  curl --cacert .certs/broker/ca.crt --cert .certs/clusters/rome/tls.crt --key .certs/clusters/rome/tls.key $BROKER/api/v2/clusters
MSG
if [ -t 0 ] && [ "${DEMO_HOLD:-1}" = 1 ]; then
  echo; echo "Broker running; Ctrl-C tears everything down."
  wait $broker_pid || true
fi
