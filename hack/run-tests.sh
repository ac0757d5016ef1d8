#!/usr/bin/env bash
# The body of `make test`: every suite (the image builder's module too),
# then the two mount-destination race tests once more each, alone and at
# full strength (10,000 command starts, see testkit/testenv.RaceStarts).
# In the parallel pass they make a few hundred starts; alone they do not
# compete with the other suites for the kernel's mount table, which is
# what their starts wait on.
#
# Usage: hack/run-tests.sh LOG [go test flags...]
# Expects KUBEBUILDER_ASSETS and the containerd environment
# (hack/containerd.sh env). Output goes to the terminal and to LOG; a
# summary of every pass ends it. Exits non-zero when any pass failed.
set -uo pipefail
log=${1:?usage: run-tests.sh LOG [go test flags...]}
shift
: >"$log"
rc=0

pass() {
	echo "== $*" | tee -a "$log"
	"$@" 2>&1 | tee -a "$log"
	local r=${PIPESTATUS[0]}
	if ((r != 0)); then rc=$r; fi
}

# Every tier but the opt-in suites: untagged tests and the e2e tag.
SANDBOX_RACE_STARTS=300 pass go test -tags e2e "$@" ./...
# The image builder is a module of its own (hack/image): ./... above does
# not reach it.
image_module() { (cd hack/image && GOWORK=off go test "$@" ./...); }
pass image_module "$@"
SANDBOX_RACE_STARTS=10000 pass go test "$@" -run '^TestMountDestinationExchangeRace$' ./runtimes/bwrap/
SANDBOX_RACE_STARTS=10000 pass go test -tags e2e "$@" ./test/e2e/containerd/ -ginkgo.focus 'exchanges its parent'
exit $rc
