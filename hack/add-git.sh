#!/usr/bin/env bash
# add-git.sh ROOTFS: copies the host's git into a test image's rootfs, with
# the shared libraries it loads, so tests can run git inside a containerd or
# Incus sandbox without an image registry or a distribution bootstrap (a
# second, where debootstrap takes minutes). Only the git binary itself is
# copied: every command the tests use (status, commit, rev-parse, reset, gc
# and what gc runs) is built into it; git finds its helpers through
# /usr/lib/git-core/git, a hard link to the same file.
set -euo pipefail

say() { printf 'add-git.sh: %s\n' "$*" >&2; }

root=${1:?usage: add-git.sh ROOTFS}
git=$(command -v git) || { say "git is not installed on the host; run hack/install-deps.sh"; exit 1; }
git=$(readlink -f "$git")
command -v ldd >/dev/null || { say "ldd is missing (package libc-bin)"; exit 1; }

mkdir -p "$root/usr/bin" "$root/usr/lib/git-core"
cp "$git" "$root/usr/bin/git"
ln -f "$root/usr/bin/git" "$root/usr/lib/git-core/git"

# ldd prints "name => /path (addr)" for libraries and "/path (addr)" for the
# loader; each is copied to the same path, links resolved to their target
# under both names.
ldd "$git" | awk '/=> \//{print $3} /^\t\//{print $1}' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# The templates keep `git worktree add` and `git init` from warning.
if [ -d /usr/share/git-core/templates ]; then
  mkdir -p "$root/usr/share/git-core"
  cp -r /usr/share/git-core/templates "$root/usr/share/git-core/"
fi
