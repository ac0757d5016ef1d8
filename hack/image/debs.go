package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// fetchDebs returns a .deb for each package, downloading those not yet in
// dir with apt-get (from the machine's apt sources; nothing from an image
// registry). apt's lists are refreshed once if a download fails.
// maxPackageFile bounds one file taken from a Debian package into memory:
// the largest the image needs (git's binaries) are a few MiB.
const maxPackageFile = 256 << 20

func fetchDebs(dir, arch string, packages []string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the package directory: %w", err)
	}
	debArch := map[string]string{"amd64": "amd64", "arm64": "arm64"}[arch]
	if debArch == "" {
		return nil, fmt.Errorf("architecture %q: only amd64 and arm64 are supported", arch)
	}
	var out []string
	updated := false
	for _, p := range packages {
		pattern := filepath.Join(dir, p+"_*_"+debArch+".deb")
		found, _ := filepath.Glob(pattern)
		if len(found) == 0 {
			err := aptDownload(dir, p+":"+debArch)
			if err != nil && !updated {
				updated = true
				if uerr := run("", "apt-get", "update", "-qq"); uerr != nil {
					return nil, fmt.Errorf("downloading %s: %w; apt-get update failed too: %w", p, err, uerr)
				}
				err = aptDownload(dir, p+":"+debArch)
			}
			if err != nil {
				return nil, fmt.Errorf("downloading %s: %w", p, err)
			}
			found, _ = filepath.Glob(pattern)
		}
		if len(found) != 1 {
			return nil, fmt.Errorf("package %s: want one file matching %s, found %d (remove the old ones)", p, pattern, len(found))
		}
		out = append(out, found[0])
	}
	return out, nil
}

func aptDownload(dir, pkg string) error {
	return run(dir, "apt-get", "download", "-qq", pkg)
}

// toolTimeout bounds each apt-get or dpkg-deb call: a stalled mirror must
// fail the build, not hang it.
const toolTimeout = 5 * time.Minute

func run(dir, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return nil
}

// unpack adds the files of a .deb to t, read through dpkg-deb (which knows
// every compression a .deb may use) without writing them to disk.
func unpack(t tree, deb string) error {
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("unpacking %s: %w", deb, err)
	}
	readErr := readTar(t, stdout, filepath.Base(deb))
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("unpacking %s: %w: %s", deb, err, strings.TrimSpace(errb.String()))
	}
	if readErr != nil {
		return fmt.Errorf("unpacking %s: %w", deb, readErr)
	}
	return nil
}

func readTar(t tree, r io.Reader, from string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := usrMerged(h.Name)
		if p == "" {
			continue
		}
		e := &entry{mode: h.FileInfo().Mode().Perm(), from: from}
		switch h.Typeflag {
		case tar.TypeDir:
			e.kind = kindDir
		case tar.TypeSymlink:
			e.kind, e.link = kindSymlink, h.Linkname
		case tar.TypeLink:
			// A hard link carries no content of its own: copy its target's.
			target, ok := t[usrMerged(h.Linkname)]
			if !ok || target.kind != kindFile {
				return fmt.Errorf("hard link %s to %s, which is not a file read before it", h.Name, h.Linkname)
			}
			e.kind, e.data, e.mode = kindFile, target.data, target.mode
		case tar.TypeReg:
			e.kind = kindFile
			if h.Size > maxPackageFile {
				return fmt.Errorf("%s holds %d bytes, more than the %d a package file of the image may", h.Name, h.Size, maxPackageFile)
			}
			if e.data, err = io.ReadAll(io.LimitReader(tr, maxPackageFile)); err != nil {
				return fmt.Errorf("reading %s: %w", h.Name, err)
			}
		default:
			continue
		}
		t[p] = e
	}
}

// usrMerged maps a package path to the image's merged-/usr layout (/bin,
// /sbin, /lib* are links into /usr there, as on Debian since bookworm's
// installer), as a clean relative path; "" for the root itself.
func usrMerged(name string) string {
	p := strings.TrimPrefix(path.Clean("/"+name), "/")
	if p == "" {
		return ""
	}
	top, rest, _ := strings.Cut(p, "/")
	switch top {
	case "bin", "sbin", "lib", "lib32", "lib64", "libx32":
		return path.Join("usr", top, rest)
	}
	return p
}
