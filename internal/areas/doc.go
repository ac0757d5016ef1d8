// Package areas lays out an agent's host areas and gives the controller
// contained access to the files in them and in the agent's custom mounts.
//
// Everything an agent can name is untrusted: it can plant symbolic links,
// ".." components and renames racing with the controller. So every access
// here opens its target with openat2(2) beneath a descriptor of the area or
// mount root (RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS), re-checks that the
// root is still the directory that was registered, and then acts only on the
// descriptors it opened.
//
// This package must never resolve a host path string once and use it again
// later (no Lstat-then-Open, no EvalSymlinks-then-Open), never follow a
// symbolic link out of a root, and never fall back to unconfined path
// handling when openat2 is missing: without it every access fails with
// ErrUnsupportedPlatform. View.HostPath is the one exception to "no path
// strings": it is a lexical mapping for trusted code, and says so.
package areas
