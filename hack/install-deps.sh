#!/usr/bin/env bash
# Installs Debian packages the project needs, when missing, with apt-get
# and the machine's own apt sources; on other systems it says what to
# install. Safe to run again. Every script that needs a package goes
# through here, so each install waits for another apt's lock and retries.
#
#   hack/install-deps.sh              bubblewrap, git, busybox and ip (the default
#                                     backend, worktrees, tests), when their
#                                     commands are missing
#   hack/install-deps.sh PACKAGE...   those packages, when dpkg does not
#                                     have them installed
set -euo pipefail

say() { printf '[install-deps] %s\n' "$*" >&2; }

need=()
if [ $# -eq 0 ]; then
  command -v bwrap >/dev/null || need+=(bubblewrap)
  command -v git >/dev/null || need+=(git)
  command -v busybox >/dev/null || need+=(busybox-static)
  command -v ip >/dev/null || need+=(iproute2)
else
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
  done
fi
[ ${#need[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
  say "missing: ${need[*]}; install them with your system's package manager"
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  say "missing: ${need[*]}; run as root or: sudo apt-get install ${need[*]}"
  exit 1
fi
say "installing ${need[*]}"
for try in 1 2 3 4 5; do
  if apt-get -o DPkg::Lock::Timeout=300 update -qq &&
     DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
    exit 0
  fi
  say "apt-get failed (try $try of 5); retrying in 10s"
  sleep 10
done
say "could not install ${need[*]}"
exit 1
