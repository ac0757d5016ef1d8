#!/usr/bin/env bash
# Installs the host tools the controller and its tests use, when missing:
# bubblewrap (the default backend) and git. Debian/Ubuntu with apt-get; on
# other systems it says what to install. Safe to run again.
set -euo pipefail

say() { printf '[install-deps] %s\n' "$*" >&2; }

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v git >/dev/null || need+=(git)
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
exit 1
