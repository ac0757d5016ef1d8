#!/usr/bin/env bash
# incus.sh: a real Incus daemon for the incus backend's tests and for
# `make run` with --backends incus, on Debian 12 without systemd as PID 1.
#
#   hack/incus.sh start    install if needed, start lxcfs and incusd, wait
#                          until the daemon answers, create the storage pool
#                          and the default profile, import the test image;
#                          prints `env` output
#   hack/incus.sh stop     stop every instance, then the daemon we started
#   hack/incus.sh status   exit 0 when the daemon answers
#   hack/incus.sh env      the variables tests and the controller read
#   hack/incus.sh crash    SIGKILL the daemon only (containers keep running,
#                          as after a real crash); `start` brings it back
#
# Every step checks what is there first, so `start` is safe to repeat, and
# it recovers from a daemon that was killed (a stale socket, a dead lxcfs
# FUSE mount).
#
# Incus comes from bookworm-backports (6.0 LTS), as incus-base without the
# recommended packages: containers only, no virtual machines. No network
# bridge can be made on a machine without a free IPv4 subnet, so the
# default profile has a root disk and no NIC; there is no image server, so
# the test image is a busybox rootfs built here and imported under an alias.
#
# Knobs:
#   INCUS_IMAGE_ALIAS   alias of the test image               (default sandbox-busybox)
#   INCUS_POOL_DRIVER   driver of the default pool: dir, btrfs (default dir)
#   INCUS_POOL_SIZE     size of a btrfs pool's loop file       (default 8GiB)
#   INCUS_QUOTA_POOL    a btrfs pool, and a profile of the same name whose
#                       root disk is on it, where root sizes hold
#                                                          (default quota)
#   INCUS_QUOTA_POOL_SIZE  its loop file's size           (default 2GiB)
#   INCUS_PREFIX        logs, pid file, image build            (default /var/lib/sandbox-controller-test/incus)
#   INCUS_AGENT_IDS     the controller's agent id range, FIRST:COUNT, that
#                       containers map with raw.idmap        (default 2000000000:65536)
set -euo pipefail

ALIAS=${INCUS_IMAGE_ALIAS:-sandbox-busybox}
# IMAGE_REVISION goes up whenever what the test image holds changes (it
# carries the egress probe's digest too); an imported image of another
# revision is replaced.
IMAGE_REVISION=3-$("$(dirname "${BASH_SOURCE[0]}")/egress-probe.sh" --digest)
POOL_DRIVER=${INCUS_POOL_DRIVER:-dir}
POOL_SIZE=${INCUS_POOL_SIZE:-8GiB}
QUOTA_POOL=${INCUS_QUOTA_POOL:-quota}
QUOTA_POOL_SIZE=${INCUS_QUOTA_POOL_SIZE:-2GiB}
PREFIX=${INCUS_PREFIX:-/var/lib/sandbox-controller-test/incus}
AGENT_IDS=${INCUS_AGENT_IDS:-2000000000:65536}

INCUSD=/usr/libexec/incus/incusd
SOCK=/var/lib/incus/unix.socket
LXCFS_DIR=/var/lib/lxcfs
PIDFILE=$PREFIX/incusd.pid
LOG=$PREFIX/incusd.log
# The range unprivileged containers map root to; Incus reads it from
# /etc/subuid and /etc/subgid when they have entries for root.
BASE_RANGE="root:1000000:1000000000"
# Incus 6.0 takes every root entry of at least 65536 ids as part of the
# base map of its unprivileged containers (idmap FilterPOSIX): the agent
# range is delegated in pieces smaller than that, so Incus lets containers
# map agent ids with raw.idmap but never hands them out as container ids.
AGENT_PIECE=32768

# The image's egress probe is built with the caller's go.
GO=${GO:-$(command -v go || true)}
export GO
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive

say() { printf 'incus.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

answers() { [ -S "$SOCK" ] && [ -x "$INCUSD" ] && "$INCUSD" waitready --timeout=2 >/dev/null 2>&1; }

# running_pid prints the pid of the incusd this script started, when it is
# still alive (a recycled pid is not mistaken for it).
running_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$INCUSD" ] && echo "$pid"
}

install_packages() {
  if dpkg-query -W -f='${Status}' incus-base 2>/dev/null | grep -q 'ok installed' && command -v busybox >/dev/null &&
     { [ "$POOL_DRIVER" != btrfs ] || command -v mkfs.btrfs >/dev/null; }; then
    return 0
  fi
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    local mirror
    mirror=$("$(dirname "${BASH_SOURCE[0]}")/apt-mirror.sh")
    say "adding the bookworm-backports suite from $mirror"
    cat >/etc/apt/sources.list.d/bookworm-backports.sources <<EOF
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  local pkgs=(incus-base busybox-static) try
  [ "$POOL_DRIVER" = btrfs ] && pkgs+=(btrfs-progs)
  say "installing ${pkgs[*]} from bookworm-backports"
  for try in 1 2 3 4 5; do
    # Package scripts may try to start the services; we start them below.
    if apt-get -o DPkg::Lock::Timeout=300 update -qq &&
       apt-get -o DPkg::Lock::Timeout=300 install -y -qq -t bookworm-backports --no-install-recommends "${pkgs[@]}" >/dev/null; then
      return 0
    fi
    say "apt-get failed (attempt $try), retrying in 10s"; sleep 10
  done
  die "could not install ${pkgs[*]}"
}

# agent_pieces prints root's subordinate id entries for the agent range,
# each smaller than 65536 ids.
agent_pieces() {
  local first=${AGENT_IDS%%:*} count=${AGENT_IDS##*:} n
  while [ "$count" -gt 0 ]; do
    n=$((count < AGENT_PIECE ? count : AGENT_PIECE))
    echo "root:$first:$n"
    first=$((first + n)) count=$((count - n))
  done
}

# allow_idmap lets containers map agent ids with raw.idmap: Incus allows
# only host ids root may delegate. The base range stays root's first and
# only large entry. Host root itself is never delegated (an entry this
# script wrote before agents had their own ids is taken out). It returns 0
# when it changed a file (the daemon reads them when it starts).
allow_idmap() {
  local changed=1 f want pieces
  pieces=$(agent_pieces)
  for f in /etc/subuid /etc/subgid; do
    touch "$f"
    if grep -qxF "root:0:1" "$f"; then
      sed -i '/^root:0:1$/d' "$f"
      say "removed root:0:1 from $f: host root is never mapped into a container"
      changed=0
    fi
    for want in "$BASE_RANGE" $pieces; do
      if ! grep -qxF "$want" "$f"; then
        echo "$want" >>"$f"
        say "added $want to $f"
        changed=0
      fi
    done
  done
  return $changed
}

LXCFS_PIDFILE=$PREFIX/lxcfs.pid

# lxcfs_pid prints the pid of the lxcfs this script started, when alive.
lxcfs_pid() {
  local pid
  pid=$(cat "$LXCFS_PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(command -v lxcfs)" ] && echo "$pid"
}

# start_lxcfs runs lxcfs, which gives containers their own view of
# /proc/meminfo, /proc/cpuinfo and the like.
start_lxcfs() {
  # A killed lxcfs leaves its FUSE mount behind, answering ENOTCONN.
  if grep -q " $LXCFS_DIR fuse.lxcfs " /proc/mounts && ! ls "$LXCFS_DIR/proc" >/dev/null 2>&1; then
    say "unmounting the stale lxcfs mount"
    fusermount -u "$LXCFS_DIR" 2>/dev/null || umount -l "$LXCFS_DIR"
  fi
  ls "$LXCFS_DIR/proc/uptime" >/dev/null 2>&1 && return 0
  mkdir -p "$LXCFS_DIR"
  setsid lxcfs "$LXCFS_DIR" </dev/null >>"$PREFIX/lxcfs.log" 2>&1 &
  echo $! >"$LXCFS_PIDFILE"
  local i
  for i in $(seq 50); do
    ls "$LXCFS_DIR/proc/uptime" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  # Containers run without lxcfs; they only see the host's /proc numbers.
  say "lxcfs did not come up (log $PREFIX/lxcfs.log); containers will see the host's /proc/meminfo"
}

start_daemon() {
  answers && return 0
  local pid
  if ! pid=$(running_pid); then
    # A killed daemon leaves its socket; the new one must bind it afresh.
    rm -f "$SOCK" /var/lib/incus/unix.socket.user
    say "starting incusd (log $LOG)"
    # incusd runs helpers (forkstart, forkexec, …) from its own directory.
    PATH=/usr/libexec/incus:$PATH setsid "$INCUSD" --group incus-admin --logfile "$LOG" </dev/null >>"$LOG.out" 2>&1 &
    pid=$!
    echo "$pid" >"$PIDFILE"
  fi
  local i
  for i in $(seq 120); do
    answers && return 0
    kill -0 "$pid" 2>/dev/null || { tail -20 "$LOG" "$LOG.out" >&2; die "incusd exited during start"; }
    sleep 0.5
  done
  tail -20 "$LOG" >&2
  die "incusd did not answer on $SOCK within 60s"
}

stop_daemon() {
  local pid
  pid=$(running_pid) || { say "no incusd started by this script is running"; return 0; }
  if answers; then
    local name
    for name in $(incus list --all-projects --format csv --columns n 2>/dev/null); do
      incus stop --force --all-projects "$name" >/dev/null 2>&1 || true
    done
  fi
  # SIGTERM makes incusd exit and leave instances as they are.
  kill "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$PIDFILE"
  say "stopped"
}

crash_daemon() {
  local pid
  pid=$(running_pid) || die "no incusd started by this script is running"
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

init_storage() {
  if ! incus storage show default >/dev/null 2>&1; then
    say "creating storage pool default ($POOL_DRIVER)"
    if [ "$POOL_DRIVER" = btrfs ]; then
      incus storage create default btrfs size="$POOL_SIZE" >/dev/null
    else
      incus storage create default "$POOL_DRIVER" >/dev/null
    fi
  fi
  if ! incus profile device get default root pool >/dev/null 2>&1; then
    incus profile device add default root disk path=/ pool=default >/dev/null
    say "default profile: root disk on pool default, no NIC"
  fi
  # A pool with quotas, so that a root disk's size holds (a dir pool on a
  # file system without project quotas ignores it), and a profile whose
  # root disk is on it, for the rootSizeLimit tests.
  if ! incus storage show "$QUOTA_POOL" >/dev/null 2>&1; then
    "$(dirname "${BASH_SOURCE[0]}")/install-deps.sh" btrfs-progs
    say "creating storage pool $QUOTA_POOL (btrfs in a ${QUOTA_POOL_SIZE} loop file, quotas)"
    incus storage create "$QUOTA_POOL" btrfs size="$QUOTA_POOL_SIZE" >/dev/null
  fi
  if ! incus profile show "$QUOTA_POOL" >/dev/null 2>&1; then
    incus profile create "$QUOTA_POOL" >/dev/null
    incus profile device add "$QUOTA_POOL" root disk path=/ pool="$QUOTA_POOL" >/dev/null
    say "profile $QUOTA_POOL: root disk on pool $QUOTA_POOL"
  fi
}

# build_image writes a busybox-static rootfs and its metadata as one
# tarball. busybox init runs only what inittab lists and then idles as PID
# 1; incus stop sends it SIGPWR, on which it syncs and ends.
build_image() {
  local work=$1
  rm -rf "$work"
  mkdir -p "$work/rootfs"
  (
    cd "$work/rootfs"
    mkdir -p bin sbin etc proc sys dev tmp run root var/log
    cp "$(command -v busybox)" bin/busybox
    for applet in $(./bin/busybox --list); do
      [ -e "bin/$applet" ] || ln -s busybox "bin/$applet"
    done
    ln -sf ../bin/busybox sbin/init
    printf '::sysinit:/bin/mount -t tmpfs -o size=64m tmpfs /tmp\n::shutdown:/bin/sync\n' >etc/inittab
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >etc/passwd
    printf 'root:x:0:\nnogroup:x:65534:\n' >etc/group
    chmod 1777 tmp
    chmod 700 root
  )
  "$(dirname "${BASH_SOURCE[0]}")/add-git.sh" "$work/rootfs"
  "$(dirname "${BASH_SOURCE[0]}")/egress-probe.sh" "$work/rootfs"
  cat >"$work/metadata.yaml" <<EOF
architecture: $(uname -m)
creation_date: $(date +%s)
properties:
  description: busybox-static, git and the egress probe, test image of sandbox-controller
  revision: "$IMAGE_REVISION"
  os: busybox
  release: "$(busybox 2>&1 | head -1 | awk '{print $2}')"
EOF
  tar --numeric-owner --owner=0 --group=0 -C "$work" -cJf "$work/image.tar.xz" metadata.yaml rootfs
}

import_image() {
  import_busybox
  # A second name for the same image: tests change a Sandbox's image
  # without building another one.
  if ! incus image alias list --format csv 2>/dev/null | cut -d, -f1 | grep -qxF "$ALIAS-renamed"; then
    incus image alias create "$ALIAS-renamed" "$(incus image alias list --format csv | awk -F, -v a="$ALIAS" '$1 == a {print $2}')" >/dev/null
  fi
}

import_busybox() {
  local work=$PREFIX/image fp old
  if incus image alias list --format csv 2>/dev/null | cut -d, -f1 | grep -qxF "$ALIAS"; then
    [ "$(incus image get-property "$ALIAS" revision 2>/dev/null)" = "$IMAGE_REVISION" ] && return 0
    say "image $ALIAS is an older revision: replacing it"
    old=$(incus image alias list --format csv | awk -F, -v a="$ALIAS" '$1 == a {print $2}')
    incus image alias delete "$ALIAS-renamed" >/dev/null 2>&1 || true
    incus image alias delete "$ALIAS" >/dev/null
    # Instances made from it keep their own copy of the root.
    incus image delete "$old" >/dev/null 2>&1 || true
  fi
  say "building the busybox test image"
  build_image "$work"
  # Importing a tarball the server already has fails: alias it instead.
  fp=$(sha256sum "$work/image.tar.xz" | cut -d' ' -f1)
  if incus image info "$fp" >/dev/null 2>&1; then
    incus image alias create "$ALIAS" "$fp" >/dev/null
  else
    incus image import "$work/image.tar.xz" --alias "$ALIAS" >/dev/null
  fi
  say "imported image $ALIAS"
}

print_env() {
  echo "export INCUS_SOCKET=$SOCK"
  echo "export INCUS_TEST_IMAGE=$ALIAS"
  echo "export INCUS_QUOTA_PROFILE=$QUOTA_POOL"
  echo "export INCUS_PIDFILE=$PIDFILE"
  echo "export INCUS_SETUP=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/incus.sh"
}

[ "$(id -u)" = 0 ] || die "incus needs root"
[[ $AGENT_IDS =~ ^[0-9]+:[0-9]+$ ]] && [ "${AGENT_IDS%%:*}" -gt 0 ] && [ "${AGENT_IDS##*:}" -gt 0 ] ||
  die "INCUS_AGENT_IDS=$AGENT_IDS: want FIRST:COUNT with FIRST above 0 (agents never map host root)"
mkdir -p "$PREFIX"
case ${1:-start} in
  start)
    install_packages
    if allow_idmap && answers; then
      # The daemon read the id ranges when it started; take the new ones.
      pid=$(running_pid) || die "the subordinate id files changed; restart incusd so that it reads them"
      say "restarting incusd to read the new subordinate id ranges"
      kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    start_lxcfs
    start_daemon
    init_storage
    import_image
    print_env ;;
  stop) stop_daemon ;;
  status)
    if answers; then incus info | sed -n '/^environment:/,$p' | grep -E 'server_version|storage:' || true
    else echo "incusd is not running"; exit 1; fi ;;
  env) print_env ;;
  crash) crash_daemon ;;
  *) echo "usage: $0 [start|stop|status|env|crash]" >&2; exit 2 ;;
esac
