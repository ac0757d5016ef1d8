#!/usr/bin/env bash
# containerd.sh: a private containerd for the containerd backend's tests and
# for `make run` with --backends containerd.
#
#   hack/containerd.sh start    build if needed, start, wait until it answers,
#                               import the test image(s); prints `env` output
#   hack/containerd.sh stop     kill every task, then the daemon
#   hack/containerd.sh status   exit 0 when the daemon answers
#   hack/containerd.sh env      the variables tests and the controller read
#   hack/containerd.sh build    build containerd, its shim and ctr only
#   hack/containerd.sh crash    SIGKILL the daemon only (tasks and their shims
#                               keep running, as after a real crash)
#
# containerd and its runc shim are built from the Go module proxy at the
# version the project's client is pinned to, in a tools module of their own
# under bin/ (the project's go.mod never sees them). runc is Debian's. The
# daemon is private: its own root, state, socket and config below
# CONTAINERD_PREFIX, so it never meets another containerd on the machine.
#
# Knobs:
#   CONTAINERD_PREFIX     data, state, socket, log  (default /var/lib/sandbox-controller-test/containerd)
#   CONTAINERD_NAMESPACE  namespace of the images   (default sandbox-controller)
#   CONTAINERD_IMAGES     test images to import: busybox (default), debian (git)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=$(awk '$1 == "github.com/containerd/containerd/v2" {print $2}' "$ROOT/go.mod")
VERSION=${VERSION:-v2.4.2}
PREFIX=${CONTAINERD_PREFIX:-/var/lib/sandbox-controller-test/containerd}
NAMESPACE=${CONTAINERD_NAMESPACE:-sandbox-controller}
IMAGES=${CONTAINERD_IMAGES:-busybox}

BIN=$ROOT/bin/containerd
TOOLS=$ROOT/bin/containerd-tools
RUN=$PREFIX/run
SOCK=$RUN/containerd.sock
CONF=$PREFIX/containerd.toml
LOG=$PREFIX/containerd.log
PIDFILE=$RUN/containerd.pid
FIFOS=$PREFIX/fifo
# containerd refuses a shim socket directory longer than 42 characters, so
# it cannot live below the prefix.
SHIMS=${CONTAINERD_SHIM_DIR:-/run/sandbox-controller/shim}

# The daemon finds its shim on PATH: ours must win over any other one
# (Debian's containerd ships a v1.6 shim in /usr/bin).
export PATH=$BIN:$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin
export GOWORK=off GOFLAGS=-mod=mod

say() { printf 'containerd.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

ctr() { "$BIN/ctr" --address "$SOCK" "$@"; }
# The tasks service is the last to come up and the first to be missing when
# the daemon is misconfigured: ask it rather than the version service.
answers() { [ -S "$SOCK" ] && timeout 5 "$BIN/ctr" --address "$SOCK" tasks ls -q >/dev/null 2>&1; }

# running_pid prints the daemon's pid when the pid file names a live
# containerd of ours (a recycled pid is not mistaken for it).
running_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  # Both sides resolved: bin/ may be reached through a link.
  [ -n "$pid" ] && [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$BIN/containerd")" ] && echo "$pid"
}

install_runc() {
  command -v runc >/dev/null && return 0
  "$ROOT/hack/install-deps.sh" runc || die "could not install runc"
}

build() {
  if [ -x "$BIN/containerd" ] && [ -x "$BIN/containerd-shim-runc-v2" ] && [ -x "$BIN/ctr" ] &&
     "$BIN/containerd" --version 2>/dev/null | grep -qF " $VERSION "; then
    return 0
  fi
  command -v go >/dev/null || die "go is not on PATH"
  local mod=github.com/containerd/containerd/v2 ldflags t0=$SECONDS
  ldflags="-X $mod/version.Version=$VERSION -X $mod/version.Revision=modproxy"
  mkdir -p "$BIN" "$TOOLS"
  say "building containerd $VERSION from the Go module proxy (a few minutes on a cold cache; log $TOOLS/build.log)"
  if ! (
    cd "$TOOLS"
    [ -f go.mod ] || go mod init sandbox-controller/containerd-tools
    # tool directives pin every dependency of the three commands.
    go get -tool "$mod/cmd/containerd@$VERSION" "$mod/cmd/containerd-shim-runc-v2@$VERSION" "$mod/cmd/ctr@$VERSION"
    # Static and without cgo, so btrfs (cgo only) is left out.
    CGO_ENABLED=0 go build -trimpath -tags 'urfave_cli_no_docs no_btrfs' -ldflags "$ldflags" \
      -o "$BIN/" "$mod/cmd/containerd" "$mod/cmd/ctr"
    CGO_ENABLED=0 go build -trimpath -tags 'urfave_cli_no_docs no_grpc' -ldflags "$ldflags" \
      -o "$BIN/" "$mod/cmd/containerd-shim-runc-v2"
  ) >"$TOOLS/build.log" 2>&1; then
    tail -20 "$TOOLS/build.log" >&2
    die "building containerd failed"
  fi
  say "built containerd $VERSION in $((SECONDS - t0))s"
}

write_config() {
  [ ${#SHIMS} -le 42 ] || die "CONTAINERD_SHIM_DIR $SHIMS is longer than the 42 characters containerd allows"
  mkdir -p "$PREFIX" "$RUN" "$FIFOS" "$SHIMS"
  # CRI and the snapshotters we do not use are off: the daemon starts in
  # well under a second and does not look for a CNI setup.
  cat >"$CONF.tmp" <<EOF
version = 3
root = "$PREFIX/root"
state = "$PREFIX/state"
disabled_plugins = [
  "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime",
  "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$PREFIX/opt"

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "$SHIMS"
EOF
  mv "$CONF.tmp" "$CONF"
}

start_daemon() {
  answers && return 0
  local pid
  if ! pid=$(running_pid); then
    rm -f "$SOCK" "$SOCK.ttrpc"
    say "starting containerd (log $LOG)"
    setsid "$BIN/containerd" --config "$CONF" </dev/null >>"$LOG" 2>&1 &
    pid=$!
    echo "$pid" >"$PIDFILE"
  fi
  local i
  for i in $(seq 150); do
    answers && return 0
    kill -0 "$pid" 2>/dev/null || { tail -20 "$LOG" >&2; die "containerd exited during start"; }
    sleep 0.2
  done
  tail -20 "$LOG" >&2
  die "containerd did not answer on $SOCK within 30s"
}

# stop_tasks kills and deletes every task in every namespace: the shims
# outlive the daemon, and a task left behind keeps its mounts and cgroup.
stop_tasks() {
  local ns id
  for ns in $(ctr namespaces ls -q 2>/dev/null); do
    for id in $(ctr -n "$ns" tasks ls -q 2>/dev/null); do
      ctr -n "$ns" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr -n "$ns" tasks ls -q 2>/dev/null); do
      for _ in $(seq 50); do
        ctr -n "$ns" tasks delete "$id" >/dev/null 2>&1 && break
        sleep 0.1
      done
    done
  done
}

stop_daemon() {
  answers && stop_tasks
  local pid
  if pid=$(running_pid); then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$PIDFILE"
  rmdir "$SHIMS" 2>/dev/null || true
  say "stopped"
}

crash_daemon() {
  local pid
  pid=$(running_pid) || die "containerd is not running"
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

import_images() {
  local variant tar name want
  for variant in $IMAGES; do
    tar=$("$ROOT/hack/test-image.sh" "$variant")
    name=$("$ROOT/hack/test-image.sh" --name "$variant")
    # A tarball of a new revision carries the same name: the image is
    # imported again unless the name already points at the tarball's
    # manifest.
    want=$(tar -xOf "$tar" index.json | grep -o '"digest":"sha256:[0-9a-f]*"' | head -1 | cut -d'"' -f4)
    if ctr -n "$NAMESPACE" images ls | awk -v n="$name" '$1 == n {print $3}' | grep -qxF "$want"; then
      continue
    fi
    say "importing $name into namespace $NAMESPACE"
    # Import also unpacks into the default snapshotter, so the first
    # container does not pay for it.
    ctr -n "$NAMESPACE" images import "$tar" >/dev/null
  done
}

print_env() {
  echo "export CONTAINERD_ADDRESS=$SOCK"
  echo "export CONTAINERD_NAMESPACE=$NAMESPACE"
  echo "export CONTAINERD_PIDFILE=$PIDFILE"
  echo "export CONTAINERD_FIFO_DIR=$FIFOS"
  echo "export CONTAINERD_TEST_IMAGE=$("$ROOT/hack/test-image.sh" --name busybox)"
  echo "export CONTAINERD_TEST_IMAGE_TAR=$("$ROOT/hack/test-image.sh" --path busybox)"
  case " $IMAGES " in
    *" debian "*)
      echo "export CONTAINERD_TEST_IMAGE_GIT=$("$ROOT/hack/test-image.sh" --name debian)"
      echo "export CONTAINERD_TEST_IMAGE_GIT_TAR=$("$ROOT/hack/test-image.sh" --path debian)" ;;
  esac
}

[ "$(id -u)" = 0 ] || die "containerd needs root"
case ${1:-start} in
  start)
    install_runc
    build
    write_config
    start_daemon
    import_images
    print_env ;;
  stop) stop_daemon ;;
  status)
    if answers; then ctr version; else echo "containerd is not running"; exit 1; fi ;;
  env) print_env ;;
  build) install_runc; build ;;
  crash) crash_daemon ;;
  *) echo "usage: $0 [start|stop|status|env|build|crash]" >&2; exit 2 ;;
esac
