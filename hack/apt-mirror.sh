#!/usr/bin/env bash
# apt-mirror.sh: prints the Debian mirror this machine's apt already uses,
# so scripts that need one (debootstrap, a backports suite) take it from
# the machine rather than naming a host themselves: the first URIs: of
# /etc/apt/sources.list.d/*.sources (deb822), else the URI of the first deb
# line of /etc/apt/sources.list. Fails with a message when there is none.
#
# Knob: APT_ETC, apt's configuration directory (default /etc/apt).
set -euo pipefail

APT_ETC=${APT_ETC:-/etc/apt}

say() { printf 'apt-mirror.sh: %s\n' "$*" >&2; }

uri=
for f in "$APT_ETC"/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  uri=$(awk 'tolower($1) == "uris:" {print $2; exit}' "$f")
  [ -n "$uri" ] && break
done
if [ -z "$uri" ] && [ -f "$APT_ETC/sources.list" ]; then
  # deb [options] URI suite components…; the options may hold spaces.
  uri=$(sed -n 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$APT_ETC/sources.list" | head -1)
fi
[ -n "$uri" ] || { say "no Debian mirror found: neither a URIs: line in $APT_ETC/sources.list.d/*.sources nor a deb line in $APT_ETC/sources.list"; exit 1; }
echo "${uri%/}"
