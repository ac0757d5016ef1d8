#!/usr/bin/env bash
# The real-cluster suite (test/e2e/realcluster), as `make test-cluster` and
# the last pass of `make test` run it: start the cluster (hack/cluster.sh
# start builds what is missing: kubelet, kube-controller-manager,
# kube-scheduler, kube-proxy, the CNI plugins, crictl, a pause image), run
# the suite against it, and stop the cluster whatever the suite did. The
# suite builds the image, deploys, uses the product as a user would and
# undeploys. The cluster has two nodes, each with its kubelet, containerd
# and namespaces (hack/cluster.sh, CLUSTER_NODES=2).
#
# Usage: hack/test-cluster.sh [go test flags...]
# Exits with the suite's status, or the start's when the cluster did not
# come up (the cluster's logs are named then).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
t0=$SECONDS
# Two nodes: the second is a kubelet of its own on this machine (hack/cluster.sh).
export CLUSTER_NODES=${CLUSTER_NODES:-2}
if ! env_out=$(hack/cluster.sh start); then
	echo "test-cluster: the cluster did not start; its logs are in ${CLUSTER_PREFIX:-/var/lib/sandbox-controller-cluster}/log" >&2
	hack/cluster.sh stop >&2 || true
	exit 1
fi
echo "test-cluster: cluster up in $((SECONDS - t0)) s" >&2
eval "$env_out"
go test -tags realcluster -v "$@" ./test/e2e/realcluster/ -ginkgo.v
rc=$?
if ! hack/cluster.sh stop >&2; then
	echo "test-cluster: stopping the cluster failed; see hack/cluster.sh status" >&2
	((rc != 0)) || rc=1
fi
exit $rc
