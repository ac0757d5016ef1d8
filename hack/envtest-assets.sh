#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that envtest and `make run` use,
# from source through the Go module proxy (nothing prebuilt is downloaded).
#
#   hack/envtest-assets.sh              build what is missing, print the directory
#   hack/envtest-assets.sh --print-dir  print the directory only
#   hack/envtest-assets.sh --print-node-dir  print WITH_NODE's directory only
#
# Output: bin/k8s/<K8S_VERSION>/{kube-apiserver,etcd[,kubectl]}. A binary that
# already reports the wanted version is kept, so a second run takes a moment.
# With WITH_NODE=1 the node's binaries (kubelet, kube-controller-manager,
# kube-scheduler, kube-proxy) of the same release go to
# bin/k8s-node/<K8S_VERSION>/, apart from envtest's directory, for
# hack/cluster.sh.
#
# Environment:
#   K8S_VERSION   kube-apiserver release (default 1.37.2, pairs with controller-runtime v0.25)
#   ETCD_VERSION  etcd release (default 3.7.3)
#   WITH_KUBECTL  1 also builds kubectl from the same release (default 0)
#   WITH_NODE     1 also builds kubelet, kube-controller-manager, kube-scheduler
#                 and kube-proxy (default 0; about 7 more minutes on a busy
#                 machine after kube-apiserver, a moment when built)
#   WITH_SCHEDULER 1 also builds kube-scheduler alone (default 0), which the
#                 placement suite runs against envtest's API server
#   NODE_BIN_DIR  where those go (default bin/k8s-node/<K8S_VERSION>)
#
# Cold, on 2 cores: about 5 minutes (up to 8 on a busy machine), 2.4 GB peak
# memory, 1 GB of modules and 3 GB of build cache.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=${K8S_VERSION:-1.37.2}; K8S_VERSION=${K8S_VERSION#v}
ETCD_VERSION=${ETCD_VERSION:-3.7.3}; ETCD_VERSION=${ETCD_VERSION#v}
WITH_KUBECTL=${WITH_KUBECTL:-0}
WITH_NODE=${WITH_NODE:-0}
WITH_SCHEDULER=${WITH_SCHEDULER:-0}
out=$root/bin/k8s/$K8S_VERSION
node_out=${NODE_BIN_DIR:-$root/bin/k8s-node/$K8S_VERSION}
work=$root/bin/.envtest-build

if [ "${1:-}" = --print-dir ]; then echo "$out"; exit 0; fi
if [ "${1:-}" = --print-node-dir ]; then echo "$node_out"; exit 0; fi
[ $# -eq 0 ] || { echo "usage: $0 [--print-dir|--print-node-dir]" >&2; exit 2; }

IFS=. read -r major minor patch <<<"$K8S_VERSION"
staging=v0.$minor.$patch

# The throw-away modules below must not join a surrounding workspace or stamp
# VCS data; everything is static.
export GOWORK=off GOFLAGS="-buildvcs=false -mod=mod" CGO_ENABLED=0

say() { printf '[envtest-assets] %s\n' "$*" >&2; }

reports() { # binary wanted-first-line
  [ -x "$1" ] || return 1
  local got
  if [ "$(basename "$1")" = kubectl ]; then got=$("$1" version --client 2>/dev/null | head -n1)
  else got=$("$1" --version 2>/dev/null | head -n1); fi
  [ "$got" = "$2" ]
}

# kube-apiserver and kubectl live in k8s.io/kubernetes, whose go.mod replaces
# its staging modules with local paths; a wrapper module replaces each of them
# with the published module of the same release instead.
# The node's commands get a module of their own, so that envtest's module
# (and its go.sum) stays what it was when only kube-apiserver is wanted.
k8s_module() { # flavour (envtest | node)
  local mod=$work/k8s-$K8S_VERSION tools="kube-apiserver kubectl"
  if [ "$1" = node ]; then
    mod=$work/k8s-node-$K8S_VERSION
    tools="kubelet kube-controller-manager kube-scheduler kube-proxy kube-apiserver kubectl"
  fi
  [ -f "$mod/go.sum" ] && { echo "$mod"; return; }
  mkdir -p "$mod"
  say "resolving k8s.io/kubernetes v$K8S_VERSION"
  local upstream t
  upstream=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  [ -f "$upstream" ] || { say "could not download k8s.io/kubernetes v$K8S_VERSION"; exit 1; }
  {
    printf 'module envtestassets/k8s\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$K8S_VERSION"
    sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$upstream" |
      sort -u | while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
    printf ')\n\ntool (\n'
    for t in $tools; do printf '\tk8s.io/kubernetes/cmd/%s\n' "$t"; done
    printf ')\n'
  } >"$mod/go.mod"
  (cd "$mod" && go mod tidy >&2)
  echo "$mod"
}

build_k8s() { # kube-apiserver | kubectl | kubelet | kube-controller-manager | kube-scheduler | kube-proxy
  local cmd=$1 want="Kubernetes v$K8S_VERSION" dir=$out flavour=envtest
  [ "$cmd" = kubectl ] && want="Client Version: v$K8S_VERSION"
  case $cmd in kubelet | kube-controller-manager | kube-scheduler | kube-proxy) dir=$node_out flavour=node ;; esac
  reports "$dir/$cmd" "$want" && return 0
  local mod ld="-s -w" p t0=$SECONDS
  mod=$(k8s_module "$flavour")
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  mkdir -p "$dir"
  say "building $cmd v$K8S_VERSION (the slow part: minutes on 2 cores when cold)"
  (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$dir/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv -f "$dir/$cmd.tmp" "$dir/$cmd"
  say "built $cmd in $((SECONDS - t0))s"
}

build_etcd() {
  reports "$out/etcd" "etcd Version: $ETCD_VERSION" && return 0
  local mod=$work/etcd-$ETCD_VERSION t0=$SECONDS
  mkdir -p "$mod" "$out"
  if [ ! -f "$mod/go.sum" ]; then
    printf 'module envtestassets/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n\ntool go.etcd.io/etcd/server/v3\n' \
      "$ETCD_VERSION" >"$mod/go.mod"
    (cd "$mod" && go mod tidy >&2)
  fi
  say "building etcd v$ETCD_VERSION"
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv -f "$out/etcd.tmp" "$out/etcd"
  say "built etcd in $((SECONDS - t0))s"
}

command -v go >/dev/null || { say "go is required (Go 1.26 or newer)"; exit 1; }
build_etcd
build_k8s kube-apiserver
[ "$WITH_KUBECTL" = 1 ] && build_k8s kubectl
if [ "$WITH_NODE" = 1 ]; then
  for c in kubelet kube-controller-manager kube-scheduler kube-proxy; do build_k8s "$c"; done
elif [ "$WITH_SCHEDULER" = 1 ]; then
  build_k8s kube-scheduler
fi
echo "$out"
