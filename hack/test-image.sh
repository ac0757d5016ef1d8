#!/usr/bin/env bash
# test-image.sh: registry-free OCI images for the containerd backend, as
# image-layout tarballs that `ctr images import` (or the client's Import)
# takes as they are.
#
#   hack/test-image.sh [busybox|debian|python]   build the tarball if needed, print its path
#   hack/test-image.sh --name VARIANT     print the image name the tarball carries
#   hack/test-image.sh --path VARIANT     print the tarball's path without building
#
# busybox: Debian's busybox-static and its applet links, the host's git
#          with its libraries (hack/add-git.sh), so git works inside the
#          sandbox, and the egress tests' probe (about 13 MB, seconds).
# python:  Debian's python3 (the host's, installed from python3-minimal)
#          with its minimal standard library and the libraries it loads,
#          /usr/bin/python3 an absolute link, and a marker file
#          /usr/share/sandbox-test/marker: the system of a bwrap Sandbox
#          with spec.bwrap.image (about 15 MB, seconds).
# debian:  a Debian bookworm minbase with git and ca-certificates (about
#          80 MB, a few minutes; built once and cached, like busybox, until
#          the tarball is removed).
#
# The tarball's name carries the image's revision, so a change to what an
# image holds builds it again rather than reusing an old tarball.
#
# Knobs: TEST_IMAGE_DIR (default bin/images).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${TEST_IMAGE_DIR:-$ROOT/bin/images}

say() { printf 'test-image.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

image_name() {
  case $1 in
    busybox) echo "localhost/sandbox-controller/busybox:test" ;;
    debian) echo "localhost/sandbox-controller/debian-git:bookworm" ;;
    python) echo "localhost/sandbox-controller/python:test" ;;
    *) die "unknown image $1 (busybox, debian or python)" ;;
  esac
}

# REVISION goes up whenever what an image holds changes; the busybox
# image's name also carries a digest of the egress probe's source, which
# it holds built.
REVISION=4

tar_path() {
  image_name "$1" >/dev/null || return 1
  case $1 in
    busybox) echo "$DIR/$1-r$REVISION-$("$ROOT/hack/egress-probe.sh" --digest)-oci.tar" ;;
    *) echo "$DIR/$1-r$REVISION-oci.tar" ;;
  esac
}

apt_install() { "$ROOT/hack/install-deps.sh" "$@"; }

# The directories the sandbox binds its areas onto; runc would create them,
# but an image that has them works with a read-only root too. /var/tmp is
# where an unprivileged agent keeps container-local state that outlives a
# restart (the root's other directories belong to root).
sandbox_dirs() {
  mkdir -p "$1"/{workspace,memories,blocks,skills,tasks,tmp,var/tmp}
  chmod 1777 "$1/tmp" "$1/var/tmp"
}

busybox_rootfs() {
  local r=$1
  apt_install busybox-static
  mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,root}
  cp /bin/busybox "$r/bin/busybox"
  local applet
  for applet in $("$r/bin/busybox" --list-full); do
    [ -e "$r/$applet" ] || ln -s /bin/busybox "$r/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  "$ROOT/hack/add-git.sh" "$r"
  "$ROOT/hack/egress-probe.sh" "$r" || die "building the egress probe"
  sandbox_dirs "$r"
}

# PYTHON_MARKER is the marker file's content.
PYTHON_MARKER="from the python test image"

python_rootfs() {
  local r=$1 py ver f
  apt_install python3-minimal
  py=$(readlink -f /usr/bin/python3)
  ver=${py##*/}
  mkdir -p "$r/usr/bin" "$r/usr/share/sandbox-test" "$r"/{etc,proc,sys,dev,root}
  cp "$py" "$r/usr/bin/$ver"
  # Absolute, as Debian's alternatives are: it resolves inside the image.
  ln -s "/usr/bin/$ver" "$r/usr/bin/python3"
  ldd "$py" | awk '/=> \//{print $3} /^\t\//{print $1}' | while read -r f; do
    mkdir -p "$r$(dirname "$f")"
    cp -L "$f" "$r$f"
  done
  dpkg -L "lib$ver-minimal" "$ver-minimal" | while read -r f; do
    if [ -f "$f" ] && [ ! -L "$f" ] && [ "${f#/usr/share/}" = "$f" ]; then
      mkdir -p "$r$(dirname "$f")"
      cp "$f" "$r$f"
    fi
  done
  echo "$PYTHON_MARKER" >"$r/usr/share/sandbox-test/marker"
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  sandbox_dirs "$r"
}

debian_rootfs() {
  local r=$1
  apt_install debootstrap
  local mirror
  mirror=$("$ROOT/hack/apt-mirror.sh")
  say "debootstrap bookworm minbase with git from $mirror (a few minutes)"
  debootstrap --variant=minbase --include=git,ca-certificates bookworm "$r" "$mirror" \
    >"$DIR/debootstrap.log" 2>&1 || { tail -20 "$DIR/debootstrap.log" >&2; die "debootstrap failed"; }
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/usr/share/doc/* "$r"/usr/share/man/*
  sandbox_dirs "$r"
}

# blob FILE moves FILE into the layout's blob store under its digest and
# prints "digest size".
blob() {
  local layout=$1 file=$2 digest size
  digest=$(sha256sum "$file" | cut -d' ' -f1)
  size=$(stat -c %s "$file")
  mv "$file" "$layout/blobs/sha256/$digest"
  echo "$digest $size"
}

# pack ROOTFS NAME OUT writes a one-layer OCI image layout tarball. The
# io.containerd.image.name annotation names the image on import.
pack() {
  local rootfs=$1 name=$2 out=$3 arch layout
  arch=$(dpkg --print-architecture)
  layout=$(mktemp -d "$DIR/.layout.XXXXXX")
  mkdir -p "$layout/blobs/sha256"
  # Reproducible: sorted, numeric owners, fixed times, no device nodes.
  tar --sort=name --numeric-owner --owner=0 --group=0 --mtime=@0 \
    --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -C "$rootfs" -cf "$layout/layer.tar" .
  local diff_id layer layer_size config config_size manifest manifest_size
  diff_id=$(sha256sum "$layout/layer.tar" | cut -d' ' -f1)
  gzip -n -1 "$layout/layer.tar"
  read -r layer layer_size < <(blob "$layout" "$layout/layer.tar.gz")
  printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["/bin/sh"],"WorkingDir":"/workspace"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$arch" "$diff_id" >"$layout/config.json"
  read -r config config_size < <(blob "$layout" "$layout/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$layout/manifest.json"
  read -r manifest manifest_size < <(blob "$layout" "$layout/manifest.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$arch" "$name" "${name##*:}" >"$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  tar -C "$layout" -cf "$out.tmp" oci-layout index.json blobs
  mv "$out.tmp" "$out"
  rm -rf "$layout"
}

build() {
  local variant=$1 out name rootfs
  out=$(tar_path "$variant")
  name=$(image_name "$variant")
  if [ ! -f "$out" ]; then
    mkdir -p "$DIR"
    rootfs=$(mktemp -d "$DIR/.rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    "${variant}_rootfs" "$rootfs"
    pack "$rootfs" "$name" "$out"
    rm -rf "$rootfs"
    trap - EXIT
    say "built $name as $out"
    # Older revisions of the same image are of no use any more.
    local old
    for old in "$DIR/$variant"-r*-oci.tar; do
      [ "$old" = "$out" ] || rm -f "$old"
    done
  fi
  echo "$out"
}

arg=${1:-busybox}
case $arg in
  --name) image_name "${2:?variant}" ;;
  --path) tar_path "${2:?variant}" ;;
  busybox | debian | python) build "$arg" ;;
  *) echo "usage: $0 [busybox|debian|python] | --name VARIANT | --path VARIANT" >&2; exit 2 ;;
esac
