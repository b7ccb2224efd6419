#!/usr/bin/env bash
# One real worker node: run by realnode.Start as
#   setsid [nsenter --net=<node's netns>] unshare --mount --propagation private -- bash node.sh <node dir>
# so every mount below exists only in this node's own mount namespace. It
# starts the node's containerd, imports the images, starts kube-proxy (if
# KUBE_PROXY is set) and the kubelet, and waits for them. <node dir>/node.env holds the parameters (see node.go).
# Each step is logged; a failure names the step, and realnode.Start reports
# it with this log's path.
set -euo pipefail
DIR=$1
# shellcheck source=/dev/null
source "$DIR/node.env"
STEP=start
step() { STEP=$1; echo "$(date +%T.%N) node $NODE: $1"; }
trap 'rc=$?; echo "node $NODE: step \"$STEP\" failed (exit $rc)"; exit $rc' ERR

step "mounts"
# containerd's shims put their sockets under /run/containerd/s (fixed path).
mount -t tmpfs -o mode=0711 rb-node-run /run/containerd
# Fixed paths of the kubelet and of libcni, one per node.
mount --bind "$DIR/kubelet" /var/lib/kubelet
mount --bind "$DIR/cni" /var/lib/cni
mount --bind "$DIR/containers" /var/log/containers
# The kubelet writes these at start; the host keeps its own values.
for f in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do
	copy="$DIR/sys/${f//\//_}"
	cat "/proc/sys/$f" >"$copy"
	mount --bind "$copy" "/proc/sys/$f"
done
# The node's size: cAdvisor reads MemTotal from /proc/meminfo and counts the
# CPUs of NUMA node 0; the real cpuset stays the host's.
mount --bind "$DIR/meminfo" /proc/meminfo
mount -t tmpfs rb-node-sys /sys/devices/system/node
for entry in $CPU_ENTRIES; do
	d="/sys/devices/system/node/node0/${entry%%:*}/topology"
	mkdir -p "$d"
	echo "${entry##*:}" >"$d/core_id"
	echo 0 >"$d/physical_package_id"
done

step "containerd"
containerd --config "$DIR/containerd.toml" >>"$LOG_DIR/containerd.log" 2>&1 &
echo $! >"$DIR/containerd.pid"
for _ in $(seq 400); do
	ctr --address "$SOCK" version >/dev/null 2>&1 && break
	sleep 0.05
done
ctr --address "$SOCK" version >/dev/null

step "images"
for image in $IMAGES; do
	ctr --address "$SOCK" -n k8s.io images import "$image" >/dev/null
done

if [ -n "$KUBE_PROXY" ]; then
	step "kube-proxy"
	"$KUBE_PROXY" --config "$DIR/kube-proxy.yaml" --v="$VERBOSITY" >>"$LOG_DIR/kube-proxy.log" 2>&1 &
	echo $! >"$DIR/kube-proxy.pid"
fi

step "kubelet"
trap - ERR
# The kubelet runs until it exits; while kubelet.held exists (KillKubelet
# made it) it stays down, and comes back when the file goes (StartKubelet),
# as a node whose kubelet crashed and was restarted. Stop writes stopping.
while :; do
	"$KUBELET" --config "$DIR/kubelet.yaml" --kubeconfig "$KUBECONFIG_FILE" --root-dir /var/lib/kubelet \
		--cert-dir "$DIR/pki" --hostname-override "$NODE" --node-ip "$NODE_IP" --node-labels "$NODE_LABELS" \
		--v="$VERBOSITY" >>"$LOG_DIR/kubelet.log" 2>&1 &
	echo $! >"$DIR/kubelet.pid"
	step "running"
	wait $! || true
	[ -e "$DIR/kubelet.held" ] || break
	step "kubelet down"
	while [ -e "$DIR/kubelet.held" ] && [ ! -e "$DIR/stopping" ]; do sleep 0.1; done
	[ ! -e "$DIR/stopping" ] || break
	step "kubelet restart"
done
wait
