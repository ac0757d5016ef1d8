#!/usr/bin/env bash
# egress-probe.sh: the egress tests' static probe (testkit/egresstest/probe)
# for the test images.
#
#   hack/egress-probe.sh --digest     print a digest of the probe's source,
#                                     which images carry in their revision
#   hack/egress-probe.sh ROOTFS       build it into ROOTFS/usr/local/bin
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/testkit/egresstest/probe

case ${1:?"--digest or ROOTFS"} in
  --digest) cat "$SRC"/*.go | sha256sum | cut -c1-12 ;;
  *)
    GO=${GO:-$(command -v go || true)}
    # Where hack/install-deps.sh and the Go tarball put it.
    [ -n "$GO" ] || [ ! -x /usr/local/go/bin/go ] || GO=/usr/local/go/bin/go
    [ -n "$GO" ] || { echo "egress-probe.sh: building the probe needs go (in PATH, or named by GO)" >&2; exit 1; }
    mkdir -p "$1/usr/local/bin"
    (cd "$ROOT" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags=-s -o "$1/usr/local/bin/egress-probe" ./testkit/egresstest/probe)
    ;;
esac
