#!/usr/bin/env bash
# cluster.sh: a real single-node Kubernetes cluster on this machine, every
# part built from source through the Go module proxy: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, a kubelet registered as a node,
# kube-proxy (iptables mode), a containerd of its own with the CRI plugin,
# the CNI plugins, a pause image, and metrics-server (the Metrics API, for
# kubectl top). Nothing comes from an image registry.
#
#   hack/cluster.sh start    build what is missing, start what is not running,
#                            wait until the node is Ready; prints `env` output
#   hack/cluster.sh stop     stop every process, pod and mount it started; the
#                            state (etcd, images, certificates) is kept
#   hack/cluster.sh clean    stop, then remove the state too (the next start
#                            is a new cluster)
#   hack/cluster.sh status   exit 0 when the API server answers; print the nodes
#   hack/cluster.sh env      the variables a caller needs
#   hack/cluster.sh node-down  (CLUSTER_NODES=2) kill every process of the
#                            second node at once, as a machine that dies
#   hack/cluster.sh node-up  start the second node again
#   hack/cluster.sh smoke    run the probe (below) as a pod on the pod network
#                            and as a hostNetwork pod; exit 0 when both reach
#                            the API server through the kubernetes service
#
# What a caller needs:
#   eval "$(hack/cluster.sh env)"  sets KUBECONFIG (cluster-admin), KUBECTL,
#                            CLUSTER_CONTAINERD_ADDRESS, CLUSTER_PAUSE_IMAGE,
#                            CRI_CONFIG_FILE (for crictl).
#   Images: the kubelet pulls nothing (no registry is reachable); import an
#   OCI or docker archive into the cluster's containerd, namespace k8s.io,
#   and refer to it by the name it carries with imagePullPolicy: IfNotPresent
#   or Never (a :latest tag implies Always, which fails):
#     bin/containerd/ctr --address "$CLUSTER_CONTAINERD_ADDRESS" -n k8s.io images import FILE
#   bin/crictl ps -a lists the node's containers (CRI_CONFIG_FILE from `env`
#   points it at the cluster's containerd).
#   In-cluster clients: kube-proxy runs, so KUBERNETES_SERVICE_HOST (the first
#   address of CLUSTER_SERVICE_CIDR) reaches the API server from pods on the
#   pod network and from hostNetwork pods alike. There is no cluster DNS:
#   kubernetes.default.svc does not resolve in pods.
#   The pause image (localhost/sandbox-controller/pause:1) holds one static
#   binary, /pause; `/pause -probe` is a smoke test that calls the API server
#   with the pod's service account token.
#
# The API server's front proxy is configured (a front-proxy CA and client
# certificate of its own, the X-Remote-* headers, aggregator routing), so
# aggregated APIs work: the exec API through the API server, for one.
#
# The control plane and the node are host processes (no static pods):
# their logs are in $CLUSTER_PREFIX/log/. Client certificates for every
# component, the service-account keys and the cluster-signing CA are made
# with openssl on the first start. The API server listens on the address of
# the default route's interface (kubelet, pods and kube-proxy reach it
# there); a change of that address re-issues its serving certificate.
# Binaries: bin/k8s/<v>/ (etcd, kube-apiserver, kubectl) and
# bin/k8s-node/<v>/ (kubelet, kube-controller-manager, kube-scheduler,
# kube-proxy) from hack/envtest-assets.sh WITH_NODE=1; bin/containerd/ from
# hack/containerd.sh; bin/cni/ (bridge, host-local, loopback, portmap) and
# bin/crictl from containernetworking/plugins and cri-tools; runc and
# iptables are Debian's.
#
# Knobs (defaults in brackets):
#   CLUSTER_PREFIX          state, logs, sockets      [/var/lib/sandbox-controller-cluster]
#   CLUSTER_RUN_DIR         shim sockets, runc state  [/run/sandbox-controller-cluster]
#   CLUSTER_NODE_NAME       the node's name           [hostname, lower case]
#   CLUSTER_ADDRESS         API server and node IP    [first address of the default route's device]
#   CLUSTER_API_PORT        API server port           [6443]
#   CLUSTER_ETCD_PORT       etcd client port (peer port is one more)  [2379]
#   CLUSTER_KUBELET_PORT    kubelet port (healthz is 10248)  [10250]
#   CLUSTER_POD_CIDR        the bridge's pod addresses   [10.244.0.0/24]
#   CLUSTER_SERVICE_CIDR    service addresses            [10.96.0.0/16]
#   CLUSTER_READY_TIMEOUT   seconds to wait for the node to be Ready  [180]
#   CLUSTER_SHARED_DIRS     host directories pods mount with propagation,
#                           made shared mounts (below)
#                           [/var/lib/sandbox-controller $CLUSTER_PREFIX/containerd]
#   CLUSTER_NODES           1, or 2 for a second node (below)  [1]
#   CLUSTER_NODE2_NAME      the second node's name       [CLUSTER_NODE_NAME-2]
#   CLUSTER_NODE2_ADDRESS   its address, on a veth pair  [10.245.255.2; this
#                           machine's end CLUSTER_NODE2_HOST_ADDRESS 10.245.255.1]
#   CLUSTER_NODE2_POD_CIDR  its pods' addresses          [10.244.1.0/24]
#   K8S_VERSION             [1.37.2]; CNI_VERSION [v1.10.0]; CRICTL_VERSION [v1.37.0]
# Fixed ports on 127.0.0.1: kube-controller-manager 10257, kube-scheduler
# 10259, kubelet healthz 10248, kube-proxy healthz 10256 and metrics 10249.
#
# The kubelet changes a few kernel settings (sysctl) when it starts and the
# bridge plugin turns on IPv4 forwarding; stop puts back the values they had
# before. kube-proxy is told to leave the host's conntrack settings alone.
#
# Pods get addresses on the bridge sc-cni0 without masquerading, and a
# FORWARD rule drops what would leave the bridge (the bridge plugin turns
# forwarding on): they reach this machine (and each other), nothing beyond.
# Service addresses that kube-proxy does not translate are routed into that
# bridge, so they never leave the machine either.
#
# Measured on 2 cores shared with other builds (load about 4), 2026-12:
#   build, kube-apiserver already built (its build cache warm): kubelet 247 s,
#     kube-controller-manager 119 s, kube-scheduler 22 s, kube-proxy 33 s
#     (7 min); CNI plugins and crictl 131 s; the pause image 5 s.
#   build from an empty Go build cache (modules already downloaded), load
#     about 5: etcd 183 s, kube-apiserver 770 s, kubelet 200 s,
#     kube-controller-manager 98 s, kube-scheduler 20 s, kube-proxy 27 s
#     (22 min; 4 GB of build cache)
#   start, all built, no state (certificates made): Ready 10-13 s
#   start after stop (state kept): Ready in 7 s; start while running: 3 s
#   stop: 3 s; a pod from the pause image, created to Succeeded: 4 s
#   the second node (CLUSTER_NODES=2), all built: Ready 20-30 s after the
#     first; node-down at once, node-up to Ready 2-15 s
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${CLUSTER_PREFIX:-/var/lib/sandbox-controller-cluster}
RUNDIR=${CLUSTER_RUN_DIR:-/run/sandbox-controller-cluster}
NODE=${CLUSTER_NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}
API_PORT=${CLUSTER_API_PORT:-6443}
ETCD_PORT=${CLUSTER_ETCD_PORT:-2379}
KUBELET_PORT=${CLUSTER_KUBELET_PORT:-10250}
POD_CIDR=${CLUSTER_POD_CIDR:-10.244.0.0/24}
SERVICE_CIDR=${CLUSTER_SERVICE_CIDR:-10.96.0.0/16}
READY_TIMEOUT=${CLUSTER_READY_TIMEOUT:-180}
SHARED_DIRS=${CLUSTER_SHARED_DIRS:-/var/lib/sandbox-controller $PREFIX/containerd}
CNI_VERSION=${CNI_VERSION:-v1.10.0}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
METRICS_SERVER_VERSION=${METRICS_SERVER_VERSION:-v0.8.0}
METRICS_PORT=${CLUSTER_METRICS_PORT:-10352}
export K8S_VERSION=${K8S_VERSION:-1.37.2}

K8S_BIN=$("$ROOT/hack/envtest-assets.sh" --print-dir)
NODE_BIN=$("$ROOT/hack/envtest-assets.sh" --print-node-dir)
CTRD_BIN=$ROOT/bin/containerd
CNI_BIN=$ROOT/bin/cni
TOOLS=$ROOT/bin/cluster-tools
IMAGES=$ROOT/bin/cluster-images
PAUSE_IMAGE=localhost/sandbox-controller/pause:1
PAUSE_TAR=$IMAGES/pause-1-oci.tar

PKI=$PREFIX/pki
LOGS=$PREFIX/log
PIDS=$PREFIX/pid
CNI_CONF=$PREFIX/cni/net.d
SOCK=$PREFIX/containerd/containerd.sock
CTRD_CONF=$PREFIX/containerd/config.toml
SHIMS=$RUNDIR/shim
ADMIN_KUBECONFIG=$PREFIX/admin.kubeconfig
BRIDGE=sc-cni0
EGRESS_CHAIN=SC-CLUSTER-EGRESS
# The kubelet's pods live below this cgroup (kubepods inside it), apart
# from anything else on the machine.
CGROUP_ROOT=/sandbox-controller-cluster

# Our shim first: Debian's containerd ships a v1.6 one in /usr/bin.
export PATH=$CTRD_BIN:$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin
export GOWORK=off GOFLAGS="-buildvcs=false -mod=mod"

say() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# settle TMP: TMP replaces the file it is named after (TMP without .tmp)
# only when their contents differ. kube-proxy exits when its configuration
# file is written, even with the same content.
settle() {
  local dest=${1%.tmp}
  if cmp -s "$1" "$dest"; then rm -f "$1"; else mv -f "$1" "$dest"; fi
}

# Each call has a deadline: wait_for retries until its own, but one call
# that hangs would hold it forever.
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" --request-timeout=30s "$@"; }
ctr() { timeout 120 "$CTRD_BIN/ctr" --address "$SOCK" "$@"; }

address() {
  if [ -n "${CLUSTER_ADDRESS:-}" ]; then echo "$CLUSTER_ADDRESS"; return; fi
  local dev='' a=''
  dev=$(ip -4 route show default 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -1)
  [ -n "$dev" ] && a=$(ip -4 -o addr show dev "$dev" scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -1)
  [ -n "$a" ] || die "no default route to take an address from: set CLUSTER_ADDRESS to an address of this machine"
  echo "$a"
}

# The first address of the service range is the kubernetes service's.
service_ip() {
  local net=${SERVICE_CIDR%/*} a b c d
  IFS=. read -r a b c d <<<"$net"
  echo "$a.$b.$c.$((d + 1))"
}

# ---------------------------------------------------------------- build

apt_install() { "$ROOT/hack/install-deps.sh" "$@" || die "could not install $*"; }

build_k8s() {
  WITH_KUBECTL=1 WITH_NODE=1 "$ROOT/hack/envtest-assets.sh" >/dev/null
}

build_containerd() {
  [ -x "$CTRD_BIN/containerd" ] && [ -x "$CTRD_BIN/containerd-shim-runc-v2" ] && [ -x "$CTRD_BIN/ctr" ] && return 0
  "$ROOT/hack/containerd.sh" build
}

# build_tools builds the CNI plugins and crictl in a tools module of their
# own (their dependencies never meet the project's go.mod).
build_tools() {
  local plugins="main/bridge ipam/host-local main/loopback meta/portmap" p ok=1
  for p in $plugins; do [ -x "$CNI_BIN/${p#*/}" ] || ok=0; done
  [ -x "$ROOT/bin/crictl" ] || ok=0
  [ -f "$TOOLS/.built-$CNI_VERSION-$CRICTL_VERSION" ] || ok=0
  [ "$ok" = 1 ] && return 0
  local t0=$SECONDS pkgs=()
  for p in $plugins; do pkgs+=("github.com/containernetworking/plugins/plugins/$p"); done
  mkdir -p "$TOOLS" "$CNI_BIN"
  say "building the CNI plugins $CNI_VERSION and crictl $CRICTL_VERSION (log $TOOLS/build.log)"
  if ! (
    cd "$TOOLS"
    [ -f go.mod ] || go mod init sandbox-controller/cluster-tools
    local gets=() q
    for q in "${pkgs[@]}"; do gets+=("$q@$CNI_VERSION"); done
    go get -tool "${gets[@]}" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_VERSION" \
      -o "$CNI_BIN/" "${pkgs[@]}"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
      -o "$ROOT/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl
  ) >"$TOOLS/build.log" 2>&1; then
    tail -20 "$TOOLS/build.log" >&2
    die "building the CNI plugins or crictl failed"
  fi
  rm -f "$TOOLS"/.built-*
  touch "$TOOLS/.built-$CNI_VERSION-$CRICTL_VERSION"
  say "built the CNI plugins and crictl in $((SECONDS - t0))s"
}

# build_metrics_server builds metrics-server, which serves the Metrics API
# (kubectl top) from the kubelets' resource metrics, in its own module.
build_metrics_server() {
  local bin=$TOOLS/metrics-server-$METRICS_SERVER_VERSION t0=$SECONDS
  [ -x "$bin" ] && return 0
  mkdir -p "$TOOLS/metrics-server"
  say "building metrics-server $METRICS_SERVER_VERSION (log $TOOLS/metrics-server.log)"
  if ! (cd "$TOOLS/metrics-server" && env -u GOFLAGS GOBIN="$TOOLS/metrics-server" CGO_ENABLED=0 \
    go install -trimpath -ldflags "-s -w" "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION") \
    >"$TOOLS/metrics-server.log" 2>&1; then
    tail -20 "$TOOLS/metrics-server.log" >&2
    die "building metrics-server failed"
  fi
  mv "$TOOLS/metrics-server/metrics-server" "$bin"
  say "built metrics-server in $((SECONDS - t0))s"
}

# build_images builds the pause binary and packs it into an image with
# hack/image/static; a change to either source builds it again.
build_images() {
  local src=$ROOT/hack/image sum
  sum=$(cat "$src/pause/main.go" "$src/static/main.go" "$src/go.sum" | sha256sum | cut -c1-16)
  [ -f "$PAUSE_TAR" ] && [ "$(cat "$IMAGES/pause.sum" 2>/dev/null)" = "$sum" ] && return 0
  mkdir -p "$IMAGES"
  say "building the pause image $PAUSE_IMAGE"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$IMAGES/pause" ./pause &&
    go run ./static -name "$PAUSE_IMAGE" -out "$PAUSE_TAR" -file "$IMAGES/pause:/pause" -entrypoint /pause)
  echo "$sum" >"$IMAGES/pause.sum"
}

# ---------------------------------------------------------------- pki

# cert NAME CN O [SANs]: a key and a certificate signed by the cluster CA
# (by the CA named in CERT_CA, front-proxy-ca say, when set).
cert() {
  local name=$1 cn=$2 o=$3 sans=${4:-} subj="/CN=$2" ca=${CERT_CA:-ca}
  [ -n "$o" ] && subj="/O=$o/CN=$cn"
  local ext=$PKI/$name.ext
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$sans" ]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$sans"
    else echo "extendedKeyUsage=clientAuth"; fi
  } >"$ext"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
}

# The client certificates the first start makes besides the CA's.
BASE_CERTS="admin apiserver-kubelet-client controller-manager scheduler kube-proxy kubelet-client"

# base_complete: the CA, the service account key and every client
# certificate are there (a start stopped halfway leaves some out).
base_complete() {
  local f
  for f in ca.key ca.crt sa.key sa.pub; do [ -s "$PKI/$f" ] || return 1; done
  for f in $BASE_CERTS; do [ -s "$PKI/$f.key" ] && [ -s "$PKI/$f.crt" ] || return 1; done
}

pki() {
  local addr=$1 svc
  svc=$(service_ip)
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  if ! base_complete; then
    if compgen -G "$PKI/*.key" >/dev/null; then
      # Certificates of the old CA would not verify against a new one.
      say "the certificates in $PKI are incomplete (a start stopped while making them): making them all again"
      running kube-apiserver >/dev/null && die "kube-apiserver runs with them: hack/cluster.sh stop first"
      rm -f "$PKI"/*.key "$PKI"/*.crt "$PKI"/*.pub "$PKI"/*.srl "$PKI/serving.for"
    fi
    say "creating the cluster CA and certificates in $PKI"
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=sandbox-controller-cluster-ca" -days 3650 -sha256 \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out "$PKI/ca.crt" 2>/dev/null
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    cert admin kubernetes-admin system:masters
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    cert controller-manager system:kube-controller-manager ""
    cert scheduler system:kube-scheduler ""
    cert kube-proxy system:kube-proxy ""
    cert kubelet-client "system:node:$NODE" system:nodes
  fi
  # The front proxy: a CA of its own whose one client, the API server,
  # vouches for the user when it proxies to an aggregated API (the exec API
  # through the API server); a state from before it gets one too.
  if ! [ -s "$PKI/front-proxy-ca.crt" ] || ! [ -s "$PKI/front-proxy-client.crt" ]; then
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/front-proxy-ca.key" 2>/dev/null
    openssl req -x509 -new -key "$PKI/front-proxy-ca.key" -subj "/CN=sandbox-controller-cluster-front-proxy-ca" -days 3650 -sha256 \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out "$PKI/front-proxy-ca.crt" 2>/dev/null
    CERT_CA=front-proxy-ca cert front-proxy-client front-proxy-client ""
  fi
  # Serving certificates name the address: made again when it changed.
  local want="$addr $NODE $SERVICE_CIDR"
  if [ "$(cat "$PKI/serving.for" 2>/dev/null)" != "$want" ]; then
    cert apiserver kube-apiserver "" \
      "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$addr,IP:$svc"
    cert kubelet "system:node:$NODE" system:nodes "DNS:$NODE,DNS:localhost,IP:127.0.0.1,IP:$addr"
    echo "$want" >"$PKI/serving.for"
  fi
}

# kubeconfig NAME CERT: a kubeconfig for the API server with a client
# certificate.
kubeconfig() {
  local file=$1 name=$2 addr=$3
  cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sandbox-controller-cluster
  cluster:
    server: https://$addr:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $name
  user:
    client-certificate: $PKI/$name.crt
    client-key: $PKI/$name.key
contexts:
- name: $name@sandbox-controller-cluster
  context: {cluster: sandbox-controller-cluster, user: $name}
current-context: $name@sandbox-controller-cluster
EOF
  settle "$file.tmp"
}

# ---------------------------------------------------------------- processes

# running NAME prints the pid of component NAME when its pid file names a
# live process of the binary that was started (a recycled pid is not
# mistaken for it), also when that binary has been rebuilt since it
# started: the kernel then names it "PATH (deleted)".
running() {
  local pid exe link
  pid=$(cat "$PIDS/$1.pid" 2>/dev/null) || return 1
  exe=$(cat "$PIDS/$1.exe" 2>/dev/null) || return 1
  [ -n "$pid" ] || return 1
  link=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "$link" = "$exe" ] || [ "$link" = "$exe (deleted)" ] || return 1
  echo "$pid"
}

# rebuilt NAME: component NAME runs, from a binary replaced since it
# started.
rebuilt() {
  local pid
  pid=$(running "$1") || return 1
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(cat "$PIDS/$1.exe") (deleted)" ]
}

# launch NAME BINARY ARGS...: start a component unless it runs; one that
# runs a binary rebuilt since is started again from the new one.
# LAUNCH_PREFIX is a command it runs under (the second node's namespaces).
LAUNCH_PREFIX=()
launch() {
  local name=$1 bin=$2
  shift 2
  if rebuilt "$name"; then
    say "restarting $name: its binary was rebuilt while it ran"
    halt "$name"
  fi
  running "$name" >/dev/null && return 0
  mkdir -p "$LOGS" "$PIDS"
  say "starting $name (log $LOGS/$name.log)"
  "${LAUNCH_PREFIX[@]}" setsid "$bin" "$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
  local pid=$! exe
  exe=$(readlink -f "$bin")
  echo "$pid" >"$PIDS/$name.pid"
  echo "$exe" >"$PIDS/$name.exe"
  # Until setsid has exec'd the binary the pid shows another program.
  for _ in $(seq 50); do
    [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
}

# gone PID: the process has exited (a zombie that init has not reaped yet
# counts as exited).
gone() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 0
  [ -z "$st" ] || [ "$st" = Z ]
}

halt() {
  local name=$1 pid
  if pid=$(running "$name"); then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do gone "$pid" && break; sleep 0.1; done
    gone "$pid" || kill -9 "$pid" 2>/dev/null
    say "stopped $name"
  fi
  rm -f "$PIDS/$name.pid" "$PIDS/$name.exe"
}

# wait_for WHAT SECONDS NAME CMD...: until CMD succeeds; fails early when
# component NAME exited.
wait_for() {
  local what=$1 secs=$2 name=$3
  shift 3
  for _ in $(seq $((secs * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    if [ -n "$name" ] && ! running "$name" >/dev/null; then
      tail -20 "$LOGS/$name.log" >&2
      die "$name exited while waiting for $what"
    fi
    sleep 0.2
  done
  [ -n "$name" ] && tail -20 "$LOGS/$name.log" >&2
  die "timed out after ${secs}s waiting for $what"
}

# ---------------------------------------------------------------- components

start_etcd() {
  launch etcd "$K8S_BIN/etcd" --name "$NODE" --data-dir "$PREFIX/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "$NODE=http://127.0.0.1:$((ETCD_PORT + 1))" --listen-metrics-urls "" --log-level warn
  wait_for "etcd" 30 etcd curl -fsS -m 5 "http://127.0.0.1:$ETCD_PORT/health"
}

start_apiserver() {
  local addr=$1
  launch kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$addr" --advertise-address "$addr" --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP,Hostname \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    --profiling=false
  wait_for "kube-apiserver /readyz" 90 kube-apiserver kubectl get --raw /readyz
}

# start_metrics_server runs metrics-server on this machine and registers
# it as the Metrics API (APIService v1beta1.metrics.k8s.io, a Service
# without selector whose endpoint is this machine): kubectl top reads the
# kubelets' resource metrics through it. It reaches the kubelets with the
# administrator's credentials and checks their serving certificates
# against the cluster's CA.
start_metrics_server() {
  local addr=$1
  mkdir -p "$PREFIX/metrics-server"
  launch metrics-server "$TOOLS/metrics-server-$METRICS_SERVER_VERSION" \
    --kubeconfig "$ADMIN_KUBECONFIG" \
    --authentication-kubeconfig "$ADMIN_KUBECONFIG" --authorization-kubeconfig "$ADMIN_KUBECONFIG" \
    --bind-address "$addr" --secure-port "$METRICS_PORT" --cert-dir "$PREFIX/metrics-server" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --kubelet-use-node-status-port --metric-resolution 15s
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: metrics-server, namespace: kube-system}
spec:
  ports: [{name: https, port: 443, targetPort: $METRICS_PORT}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: metrics-server-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: metrics-server}
addressType: IPv4
ports: [{name: https, port: $METRICS_PORT, protocol: TCP}]
endpoints: [{addresses: ["$addr"]}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.metrics.k8s.io}
spec:
  group: metrics.k8s.io
  version: v1beta1
  service: {name: metrics-server, namespace: kube-system, port: 443}
  # Its certificate is self-signed (--cert-dir); it runs beside the API
  # server on this machine.
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
YAML
}

metrics_available() {
  kubectl get apiservice v1beta1.metrics.k8s.io -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' | grep -qx True
}

start_controllers() {
  launch kube-controller-manager "$NODE_BIN/kube-controller-manager" \
    --kubeconfig "$PREFIX/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$PREFIX/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$PREFIX/controller-manager.kubeconfig" --authentication-skip-lookup \
    --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
    --use-service-account-credentials \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$POD_CIDR" --allocate-node-cidrs=false \
    --controllers '*' --profiling=false
  launch kube-scheduler "$NODE_BIN/kube-scheduler" \
    --kubeconfig "$PREFIX/scheduler.kubeconfig" \
    --authentication-kubeconfig "$PREFIX/scheduler.kubeconfig" \
    --authorization-kubeconfig "$PREFIX/scheduler.kubeconfig" --authentication-skip-lookup \
    --bind-address 127.0.0.1 --secure-port 10259 --leader-elect=false --profiling=false
}

# containerd_config [DIR CNI BRIDGE CIDR]: the configuration of a node's
# containerd and its CNI network. The text names the first node's paths;
# the second node sees its own directories at those paths (its mount
# namespace binds them there), so DIR and CNI are where its files are on
# this machine's side, and BRIDGE and CIDR its pods' network.
containerd_config() {
  local dir=${1:-$PREFIX/containerd} cni=${2:-$PREFIX/cni} bridge=${3:-$BRIDGE} cidr=${4:-$POD_CIDR}
  mkdir -p "$dir" "$SHIMS" "$cni/net.d" "$cni/ipam"
  [ ${#SHIMS} -le 42 ] || die "CLUSTER_RUN_DIR/shim ($SHIMS) is longer than the 42 characters containerd allows"
  cat >"$dir/config.toml.tmp" <<EOF
version = 3
root = "$PREFIX/containerd/root"
state = "$PREFIX/containerd/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$PREFIX/containerd/opt"

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "$SHIMS"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

# This machine's root has no CAP_SYS_RESOURCE: an oom_score_adj below
# containerd's own (the kubelet asks -998 for sandboxes) fails in runc with
# "can't get final child's PID from pipe: EOF"; restrict clamps it.
[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$CNI_CONF"
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUNDIR/runc"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
  settle "$dir/config.toml.tmp"
  # Pods: a bridge, no masquerading (the host does not forward), addresses
  # kept below the prefix.
  cat >"$cni/net.d/10-sandbox-cluster.conflist.tmp" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "sandbox-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$PREFIX/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  settle "$cni/net.d/10-sandbox-cluster.conflist.tmp"
}

ctrd_answers() { [ -S "$SOCK" ] && timeout 5 "$CTRD_BIN/ctr" --address "$SOCK" tasks ls -q >/dev/null 2>&1; }

start_containerd() {
  containerd_config
  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n' "$SOCK" "$SOCK" >"$PREFIX/crictl.yaml.tmp"
  settle "$PREFIX/crictl.yaml.tmp"
  ctrd_answers && return 0
  running containerd >/dev/null || rm -f "$SOCK" "$SOCK.ttrpc"
  launch containerd "$CTRD_BIN/containerd" --config "$CTRD_CONF" --log-level warn
  wait_for "containerd" 30 containerd ctrd_answers
}

import_pause() {
  local sock=${1:-$SOCK} want
  want=$(tar -xOf "$PAUSE_TAR" index.json | grep -o '"digest": *"sha256:[0-9a-f]*"' | head -1 | cut -d'"' -f4)
  if SOCK=$sock ctr -n k8s.io images ls 2>/dev/null | awk -v n="$PAUSE_IMAGE" '$1 == n {print $3}' | grep -qxF "$want"; then
    return 0
  fi
  say "importing $PAUSE_IMAGE into the containerd at $sock"
  SOCK=$sock ctr -n k8s.io images import "$PAUSE_TAR" >/dev/null 2>&1 || die "importing $PAUSE_TAR failed"
}

# cgroup_dirs [ROOT] prints ROOT's directory (default CGROUP_ROOT, the
# first node's) in every mounted hierarchy.
cgroup_dirs() {
  awk -v r="${1:-$CGROUP_ROOT}" '$3 == "cgroup" || $3 == "cgroup2" {print $2 r}' /proc/self/mounts
}

# make_cgroup_root ROOT: the kubelet wants its cgroup root in every
# hierarchy; cpuset's children start without CPUs and memory nodes, so
# they copy the parent's.
make_cgroup_root() {
  local d
  for d in $(cgroup_dirs "$1"); do
    [ -d "$d" ] && continue
    mkdir -p "$d"
    if [ -f "$d/cpuset.cpus" ]; then
      cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
      cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
    fi
  done
}

# The kubelet sets these on the host when it starts (vm.overcommit_memory=1,
# kernel.panic=10, kernel.panic_on_oops=1, ...) and the bridge plugin turns
# on net.ipv4.ip_forward for its gateway; both leave them so: their values
# from before the kubelet's first start are kept and put back by stop.
KERNEL_TUNABLES="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward"

save_tunables() {
  [ -f "$PREFIX/sysctl.saved" ] && return 0
  running kubelet >/dev/null && return 0
  local k
  for k in $KERNEL_TUNABLES; do echo "$k=$(sysctl -n "$k")"; done >"$PREFIX/sysctl.saved.tmp"
  mv "$PREFIX/sysctl.saved.tmp" "$PREFIX/sysctl.saved"
}

restore_tunables() {
  [ -f "$PREFIX/sysctl.saved" ] || return 0
  local kv
  while read -r kv; do sysctl -q -w "$kv" >/dev/null 2>&1 || say "could not restore $kv"; done <"$PREFIX/sysctl.saved"
  rm -f "$PREFIX/sysctl.saved"
}

# kubelet_config FILE ADDR CGROUP_ROOT POD_CIDR CERT: a node's kubelet
# configuration; paths name the first node's (see containerd_config).
kubelet_config() {
  local file=$1 addr=$2 root=$3 cidr=$4 cert=$5
  cat >"$file.tmp" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: $root
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
address: $addr
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/$cert.crt
tlsPrivateKeyFile: $PKI/$cert.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
podCIDR: $cidr
podLogsDir: $PREFIX/pod-logs
registerNode: true
rotateCertificates: false
serverTLSBootstrap: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  settle "$file.tmp"
}

start_kubelet() {
  local addr=$1
  save_tunables
  mkdir -p "$PREFIX/kubelet" "$PREFIX/pod-logs"
  make_cgroup_root "$CGROUP_ROOT"
  kubelet_config "$PREFIX/kubelet.yaml" "$addr" "$CGROUP_ROOT" "$POD_CIDR" kubelet
  launch kubelet "$NODE_BIN/kubelet" --config "$PREFIX/kubelet.yaml" \
    --kubeconfig "$PREFIX/kubelet.kubeconfig" --root-dir "$PREFIX/kubelet" \
    --hostname-override "$NODE" --node-ip "$addr"
  wait_for "kubelet /healthz" 60 kubelet curl -fsS -m 5 http://127.0.0.1:10248/healthz
}

# proxy_config FILE NODE CIDR KUBECONFIG: a node's kube-proxy configuration.
proxy_config() {
  cat >"$1.tmp" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $PREFIX/kube-proxy.kubeconfig
hostnameOverride: $2
clusterCIDR: $3
mode: iptables
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
nodePortAddresses: [primary]
EOF
  settle "$1.tmp"
}

start_proxy() {
  proxy_config "$PREFIX/kube-proxy.yaml" "$NODE" "$POD_CIDR"
  launch kube-proxy "$NODE_BIN/kube-proxy" --config "$PREFIX/kube-proxy.yaml"
}

# Service addresses that kube-proxy does not translate are routed into the
# pods' bridge (made here before the bridge plugin would make it), where
# nothing answers for them, instead of out of the default route. Pods'
# packets do not leave anyway: the host does not forward.
guard_services() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  ip route replace "$SERVICE_CIDR" dev "$BRIDGE"
  # The bridge plugin turns forwarding on, so pods' packets would go out of
  # the default route (unmasqueraded): a chain of ours drops what leaves
  # the bridge.
  iptables -N "$EGRESS_CHAIN" 2>/dev/null || iptables -F "$EGRESS_CHAIN"
  iptables -A "$EGRESS_CHAIN" -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  iptables -C FORWARD -j "$EGRESS_CHAIN" 2>/dev/null || iptables -I FORWARD 1 -j "$EGRESS_CHAIN"
}

node_ready() {
  kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

start() {
  [ "$(id -u)" = 0 ] || die "the cluster needs root"
  local t0=$SECONDS addr
  apt_install runc iptables openssl curl
  build_k8s
  build_containerd
  build_tools
  build_metrics_server
  build_images
  addr=$(address)
  pki "$addr"
  kubeconfig "$ADMIN_KUBECONFIG" admin "$addr"
  kubeconfig "$PREFIX/controller-manager.kubeconfig" controller-manager "$addr"
  kubeconfig "$PREFIX/scheduler.kubeconfig" scheduler "$addr"
  kubeconfig "$PREFIX/kube-proxy.kubeconfig" kube-proxy "$addr"
  kubeconfig "$PREFIX/kubelet.kubeconfig" kubelet-client "$addr"
  # From here on this machine's state changes (processes, mounts, kernel
  # settings, iptables): stop undoes what only a started cluster made
  # when it finds this file.
  mkdir -p "$PREFIX"
  : >"$PREFIX/started"
  guard_services
  start_etcd
  start_apiserver "$addr"
  start_controllers
  share_dirs
  start_containerd
  import_pause
  start_kubelet "$addr"
  start_proxy
  [ "$NODES" = 2 ] && start_node2 "$addr"
  wait_for "node $NODE to be Ready" "$READY_TIMEOUT" kubelet node_ready
  say "node $NODE is Ready ($((SECONDS - t0))s)"
  if [ "$NODES" = 2 ]; then
    wait_for "node $NODE2 to be Ready" "$READY_TIMEOUT" kubelet-2 node2_ready
    say "node $NODE2 is Ready ($((SECONDS - t0))s)"
  fi
  # New pods are refused until their namespace has its service account and the
  # cluster's CA in kube-root-ca.crt (kube-controller-manager makes both).
  wait_for "the default service account" 60 kube-controller-manager \
    kubectl -n default get serviceaccount/default configmap/kube-root-ca.crt
  start_metrics_server "$addr"
  wait_for "the Metrics API (metrics-server)" 60 metrics-server metrics_available
  print_env
}

# The kubelet mounts a hostPath with propagation Bidirectional only from a
# shared mount, and HostToContainer only from a shared or slave one (the
# DaemonSet's areas, and the containerd component's socket directory).
# Under systemd / is shared; on a machine whose init is something else it
# may be private. share_dirs binds each of SHARED_DIRS on itself where it is
# not a mount point and makes it shared; unshare_dirs (stop) takes away the
# binds it made. The files are never touched.
share_dirs() {
  local d prop
  for d in $SHARED_DIRS; do
    mkdir -p "$d"
    prop=$(findmnt -no PROPAGATION --target "$d")
    case $prop in shared*) continue ;; esac
    if ! mountpoint -q "$d"; then
      mount --bind "$d" "$d"
      echo "$d" >>"$PREFIX/shared-binds"
    fi
    mount --make-shared "$d"
    say "made $d a shared mount (it was $prop) for pods that mount it with propagation"
  done
}

unshare_dirs() {
  local d
  [ -f "$PREFIX/shared-binds" ] || return 0
  tac "$PREFIX/shared-binds" | while read -r d; do
    [ -n "$d" ] && mountpoint -q "$d" || continue
    umount "$d" 2>/dev/null || say "could not take away the shared bind on $d (still in use?): umount $d"
  done
  rm -f "$PREFIX/shared-binds"
}

# ---------------------------------------------------------------- second node

# With CLUSTER_NODES=2 a second node runs on this machine as a second
# machine would: its own kubelet, containerd and kube-proxy in a network
# namespace of their own (an address of its own on a veth pair, so its
# hostNetwork pods' ports and loopback are its own) and a mount namespace
# of their own, where the node's own directories are bound at the paths
# the first node uses (/var/lib/sandbox-controller, the containerd and
# CNI directories, the kubelet's), so a DaemonSet pod there finds that
# node's areas and containerd at the same paths. Its pods' cgroups are
# below CGROUP_ROOT2. `node-down` kills every process of the node (a
# machine that dies), `node-up` starts it again.
NODES=${CLUSTER_NODES:-1}
NODE2=${CLUSTER_NODE2_NAME:-$NODE-2}
N2=$PREFIX/node2
N2_RUN=$RUNDIR/node2
N2_NS=sc-node2
N2_HOST_IF=sc-node2-h
N2_HOST_ADDR=${CLUSTER_NODE2_HOST_ADDRESS:-10.245.255.1}
N2_ADDR=${CLUSTER_NODE2_ADDRESS:-10.245.255.2}
N2_POD_CIDR=${CLUSTER_NODE2_POD_CIDR:-10.244.1.0/24}
N2_BRIDGE=sc-cni1
N2_MNT=$RUNDIR/ns/node2.mnt
CGROUP_ROOT2=/sandbox-controller-cluster-2

in_node2() { nsenter --net="/run/netns/$N2_NS" --mount="$N2_MNT" -- "$@"; }

# node2_mnt_alive: the second node's mount namespace is held by its file.
node2_mnt_alive() { [ -f "$N2_MNT" ] && findmnt -n "$N2_MNT" >/dev/null 2>&1; }

node2_network() {
  ip netns list 2>/dev/null | grep -qw "$N2_NS" || ip netns add "$N2_NS"
  ip link show "$N2_HOST_IF" >/dev/null 2>&1 || ip link add "$N2_HOST_IF" type veth peer name eth0 netns "$N2_NS"
  ip addr replace "$N2_HOST_ADDR/30" dev "$N2_HOST_IF"
  ip link set "$N2_HOST_IF" up
  ip -n "$N2_NS" link set lo up
  ip -n "$N2_NS" addr replace "$N2_ADDR/30" dev eth0
  ip -n "$N2_NS" link set eth0 up
  ip -n "$N2_NS" route replace default via "$N2_HOST_ADDR"
  # Its pods answer this machine through it.
  ip route replace "$N2_POD_CIDR" via "$N2_ADDR"
  # As on the first node: service addresses kube-proxy does not translate
  # go into the pods' bridge, nowhere else.
  ip -n "$N2_NS" link show "$N2_BRIDGE" >/dev/null 2>&1 || ip -n "$N2_NS" link add "$N2_BRIDGE" type bridge
  ip -n "$N2_NS" link set "$N2_BRIDGE" up
  ip -n "$N2_NS" route replace "$SERVICE_CIDR" dev "$N2_BRIDGE"
  # Nothing of the second node is forwarded beyond this machine.
  iptables -C "$EGRESS_CHAIN" -i "$N2_HOST_IF" -j DROP 2>/dev/null || iptables -A "$EGRESS_CHAIN" -i "$N2_HOST_IF" -j DROP
}

# node2_mounts makes the second node's mount namespace (once): a copy of
# this machine's, receiving its mounts (slave), with the node's own
# directories bound over the first node's and made shared inside it, as
# the kubelet wants for Bidirectional and HostToContainer.
node2_mounts() {
  node2_mnt_alive && return 0
  mkdir -p "$RUNDIR/ns" "$N2/areas" "$N2/containerd" "$N2/cni" "$N2/kubelet" "$N2/pod-logs" \
    "$N2/var-lib-kubelet" "$N2/var-lib-cni" "$N2/var-log-containers" "$N2_RUN/shim" "$N2_RUN/runc"
  mkdir -p /var/lib/kubelet /var/lib/cni /var/log/containers "$PREFIX/kubelet" "$PREFIX/pod-logs" "$RUNDIR/runc"
  # A namespace file may not be on a shared mount.
  if ! mountpoint -q "$RUNDIR/ns"; then mount --bind "$RUNDIR/ns" "$RUNDIR/ns"; fi
  mount --make-private "$RUNDIR/ns"
  : >"$N2_MNT"
  unshare --mount="$N2_MNT" --propagation slave true
  local pair src dst
  for pair in "$N2/areas:/var/lib/sandbox-controller" "$N2/containerd:$PREFIX/containerd" "$N2/cni:$PREFIX/cni" \
    "$N2/kubelet:$PREFIX/kubelet" "$N2/pod-logs:$PREFIX/pod-logs" "$N2/var-lib-kubelet:/var/lib/kubelet" \
    "$N2/var-lib-cni:/var/lib/cni" "$N2/var-log-containers:/var/log/containers" \
    "$N2_RUN/shim:$SHIMS" "$N2_RUN/runc:$RUNDIR/runc"; do
    src=${pair%%:*} dst=${pair#*:}
    # What this machine has mounted there (the first node's shared binds,
    # its containers' mounts below) goes from the node's view first: with
    # two mounts on one path, containerd may judge the one below.
    while nsenter --mount="$N2_MNT" -- mountpoint -q "$dst"; do
      nsenter --mount="$N2_MNT" -- umount -l "$dst" || break
    done
    nsenter --mount="$N2_MNT" -- mount --bind "$src" "$dst"
    nsenter --mount="$N2_MNT" -- mount --make-shared "$dst"
  done
}

N2_CERTS="kubelet-client-2 kubelet-2"

node2_pki() {
  [ -s "$PKI/kubelet-client-2.crt" ] || cert kubelet-client-2 "system:node:$NODE2" system:nodes
  local want="$N2_ADDR $NODE2"
  if [ "$(cat "$PKI/serving-2.for" 2>/dev/null)" != "$want" ] || ! [ -s "$PKI/kubelet-2.crt" ]; then
    cert kubelet-2 "system:node:$NODE2" system:nodes "DNS:$NODE2,DNS:localhost,IP:127.0.0.1,IP:$N2_ADDR"
    echo "$want" >"$PKI/serving-2.for"
  fi
}

ctrd2_answers() { [ -S "$N2/containerd/containerd.sock" ] && timeout 5 "$CTRD_BIN/ctr" --address "$N2/containerd/containerd.sock" tasks ls -q >/dev/null 2>&1; }
node2_ready() {
  kubectl get node "$NODE2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

start_node2() {
  local addr=$1
  node2_pki
  kubeconfig "$PREFIX/kubelet-2.kubeconfig" kubelet-client-2 "$addr"
  node2_network
  node2_mounts
  containerd_config "$N2/containerd" "$N2/cni" "$N2_BRIDGE" "$N2_POD_CIDR"
  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n' "$N2/containerd/containerd.sock" "$N2/containerd/containerd.sock" >"$PREFIX/crictl-2.yaml"
  LAUNCH_PREFIX=(nsenter --net="/run/netns/$N2_NS" --mount="$N2_MNT" --)
  running containerd-2 >/dev/null || rm -f "$N2/containerd/containerd.sock" "$N2/containerd/containerd.sock.ttrpc"
  launch containerd-2 "$CTRD_BIN/containerd" --config "$CTRD_CONF" --log-level warn
  wait_for "the second node's containerd" 30 containerd-2 ctrd2_answers
  import_pause "$N2/containerd/containerd.sock"
  make_cgroup_root "$CGROUP_ROOT2"
  kubelet_config "$N2/kubelet.yaml" "$N2_ADDR" "$CGROUP_ROOT2" "$N2_POD_CIDR" kubelet-2
  launch kubelet-2 "$NODE_BIN/kubelet" --config "$N2/kubelet.yaml" \
    --kubeconfig "$PREFIX/kubelet-2.kubeconfig" --root-dir "$PREFIX/kubelet" \
    --hostname-override "$NODE2" --node-ip "$N2_ADDR"
  wait_for "the second kubelet's /healthz" 60 kubelet-2 in_node2 curl -fsS -m 5 http://127.0.0.1:10248/healthz
  proxy_config "$N2/kube-proxy.yaml" "$NODE2" "$N2_POD_CIDR"
  launch kube-proxy-2 "$NODE_BIN/kube-proxy" --config "$N2/kube-proxy.yaml"
  LAUNCH_PREFIX=()
}

# node2_pids prints the pids of every process of the second node: those
# in its mount namespace (kubelet, containerd, kube-proxy, shims) and in
# its pods' cgroups.
node2_pids() {
  local ino f pid d
  if [ -f "$N2_MNT" ] && node2_mnt_alive; then
    ino=$(stat -L -c %i "$N2_MNT" 2>/dev/null) || ino=''
    if [ -n "$ino" ]; then
      for f in /proc/[0-9]*/ns/mnt; do
        pid=${f#/proc/}; pid=${pid%/ns/mnt}
        [ "$(stat -L -c %i "$f" 2>/dev/null)" = "$ino" ] && echo "$pid"
      done
    fi
  fi
  for d in $(cgroup_dirs "$CGROUP_ROOT2"); do
    [ -d "$d" ] || continue
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
}

# node_down kills the second node the way a machine dies: every process at
# once, nothing cleaned up; node_up starts it again.
node_down() {
  local pid
  for _ in 1 2 3; do
    for pid in $(node2_pids | sort -u); do kill -9 "$pid" 2>/dev/null || true; done
    sleep 0.2
  done
  rm -f "$PIDS/kubelet-2.pid" "$PIDS/containerd-2.pid" "$PIDS/kube-proxy-2.pid"
  say "node $NODE2 is down"
}

stop_node2() {
  [ -f "$N2_MNT" ] || ip netns list 2>/dev/null | grep -qw "$N2_NS" || return 0
  halt kube-proxy-2
  halt kubelet-2
  if ctrd2_answers && [ -x "$ROOT/bin/crictl" ]; then
    CRI_CONFIG_FILE=$PREFIX/crictl-2.yaml timeout 60 "$ROOT/bin/crictl" rmp -af >/dev/null 2>&1 || true
  fi
  halt containerd-2
  node_down >/dev/null 2>&1
  # The namespace goes with its file's mount and its last process, and
  # every mount inside with it.
  umount "$N2_MNT" 2>/dev/null || umount -l "$N2_MNT" 2>/dev/null || true
  rm -f "$N2_MNT"
  ip route del "$N2_POD_CIDR" 2>/dev/null || true
  ip netns del "$N2_NS" 2>/dev/null || true
  ip link del "$N2_HOST_IF" 2>/dev/null || true
  local d
  for d in $(cgroup_dirs "$CGROUP_ROOT2"); do
    [ -d "$d" ] || continue
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

# ---------------------------------------------------------------- stop

stop_pods() {
  ctrd_answers || return 0
  # Through CRI first: the network of each pod is torn down by its plugins.
  if [ -x "$ROOT/bin/crictl" ]; then
    CRI_CONFIG_FILE=$PREFIX/crictl.yaml timeout 60 "$ROOT/bin/crictl" rmp -af >/dev/null 2>&1 || true
  fi
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

unmount_below() {
  local dir m
  for dir in "$@"; do
    [ -d "$dir" ] || continue
    dir=$(readlink -f "$dir")
    # Deepest first.
    for m in $(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
}

# The kubelet's and kube-proxy's chains (KUBE-*), the CNI plugins' (CNI-*)
# and ours (SC-CLUSTER-*), in every table, IPv4 and IPv6: first the jumps to
# them from the built-in chains, then the chains.
remove_chains() {
  local cmd table chains c rule
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for table in mangle filter nat; do
      chains=$("$cmd" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI|SC-CLUSTER)-/ {print $2}')
      [ -n "$chains" ] || continue
      "$cmd" -t "$table" -S 2>/dev/null | { grep -E -- '^-A (PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) .*-j (KUBE|CNI|SC-CLUSTER)-' || true; } |
        while read -r rule; do eval "$cmd -t $table ${rule/-A/-D}" 2>/dev/null || true; done
      for c in $chains; do "$cmd" -t "$table" -F "$c" 2>/dev/null || true; done
      for c in $chains; do "$cmd" -t "$table" -X "$c" 2>/dev/null || true; done
    done
  done
}

# kill_leftovers kills what a crashed containerd left: every process in
# the pods' cgroups, then the shims that served our daemon.
kill_leftovers() {
  local f pid d
  for d in $(cgroup_dirs); do
    [ -d "$d" ] || continue
    while read -r f; do
      for pid in $(cat "$f" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    done < <(find "$d" -name cgroup.procs 2>/dev/null)
  done
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}; pid=${pid%/cmdline}
    [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$CTRD_BIN/containerd-shim-runc-v2")" ] || continue
    tr '\0' ' ' <"$f" 2>/dev/null | grep -qF -- "-address $SOCK " && kill -9 "$pid" 2>/dev/null || true
  done
}

# Paths the kubelet and the CNI library use whatever their configuration
# says: the device-plugin socket, the links to container logs, the plugins'
# result cache. Only what points at or belongs to this cluster goes; the
# directories too when that leaves them empty.
remove_host_leftovers() {
  local f
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true
  for f in /var/log/containers/*.log; do
    [ -L "$f" ] || continue
    case $(readlink "$f") in "$PREFIX"/*) rm -f "$f" ;; esac
  done
  rmdir /var/log/containers 2>/dev/null || true
  rm -f /var/lib/cni/results/sandbox-cluster-*
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
}

# The pods' cgroups, leaves first.
remove_cgroups() {
  local d
  for d in $(cgroup_dirs); do
    [ -d "$d" ] || continue
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

stop() {
  [ "$(id -u)" = 0 ] || die "the cluster needs root"
  if running kube-proxy >/dev/null; then
    halt kube-proxy
  fi
  # kube-proxy's cleanup and the chains below are the same names any
  # kubelet uses: only when this cluster was started here.
  local ours=false
  [ -f "$PREFIX/started" ] && ours=true
  $ours && [ -x "$NODE_BIN/kube-proxy" ] && timeout 60 "$NODE_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  stop_node2
  halt kubelet
  restore_tunables
  stop_pods
  halt containerd
  kill_leftovers
  halt metrics-server
  halt kube-scheduler
  halt kube-controller-manager
  halt kube-apiserver
  halt etcd
  unmount_below "$PREFIX" "$RUNDIR"
  unshare_dirs
  if $ours; then remove_chains; fi
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  remove_cgroups
  if $ours; then remove_host_leftovers; fi
  rm -rf "$RUNDIR"
  rm -f "$PREFIX/started"
  say "stopped"
}

# smoke runs the pause image's probe as a pod on the pod network and as a
# hostNetwork pod; both must reach the API server through the kubernetes
# service with their service account token and exit 0.
smoke() {
  local ns=cluster-smoke pod net phase t0=$SECONDS
  # A namespace of an earlier run may still be terminating.
  timeout 120 "$K8S_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" delete namespace "$ns" --ignore-not-found --wait=true >/dev/null
  kubectl create namespace "$ns" >/dev/null
  wait_for "the $ns service account" 60 "" kubectl -n "$ns" get serviceaccount/default configmap/kube-root-ca.crt
  for net in false true; do
    pod=probe-hostnetwork-$net
    kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $pod}
spec:
  hostNetwork: $net
  restartPolicy: Never
  containers:
  - name: probe
    image: $PAUSE_IMAGE
    imagePullPolicy: Never
    command: ["/pause", "-probe"]
EOF
  done
  for net in false true; do
    pod=probe-hostnetwork-$net
    for _ in $(seq 300); do
      phase=$(kubectl -n "$ns" get pod "$pod" -o jsonpath='{.status.phase}' 2>/dev/null)
      case $phase in Succeeded | Failed) break ;; esac
      sleep 0.2
    done
    kubectl -n "$ns" logs "$pod" 2>&1 | sed "s/^/$pod: /" >&2
    [ "$phase" = Succeeded ] || die "$pod: phase ${phase:-unknown}, want Succeeded"
  done
  kubectl delete namespace "$ns" --wait=false >/dev/null
  say "smoke test passed ($((SECONDS - t0))s)"
}

print_env() {
  echo "export KUBECONFIG=$ADMIN_KUBECONFIG"
  echo "export KUBECTL=$K8S_BIN/kubectl"
  echo "export CLUSTER_CONTAINERD_ADDRESS=$SOCK"
  echo "export CLUSTER_PAUSE_IMAGE=$PAUSE_IMAGE"
  if [ "$NODES" = 2 ]; then
    echo "export CLUSTER_NODE2=$NODE2"
    echo "export CLUSTER_NODE2_CONTAINERD_ADDRESS=$N2/containerd/containerd.sock"
    echo "export CLUSTER_NODE2_AREAS=$N2/areas"
  fi
  echo "export CRI_CONFIG_FILE=$PREFIX/crictl.yaml"
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  clean)
    stop
    say "removing $PREFIX"
    # Never into a mount stop could not take away (a host directory a pod
    # had bound there, say).
    rm -rf --one-file-system "$PREFIX" ;;
  status)
    if [ -f "$ADMIN_KUBECONFIG" ] && kubectl get --raw /readyz >/dev/null 2>&1; then
      kubectl get nodes -o wide
    else
      echo "the cluster is not running"; exit 1
    fi ;;
  env) print_env ;;
  node-down) node_down ;;
  node-up)
    addr=$(address)
    start_node2 "$addr"
    wait_for "node $NODE2 to be Ready" "$READY_TIMEOUT" kubelet-2 node2_ready ;;
  smoke) smoke ;;
  *) echo "usage: $0 [start|stop|clean|status|env|smoke|node-down|node-up]" >&2; exit 2 ;;
esac
