package bwrap

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// nixQueryTimeout bounds nix-store -qR: a wedged Nix daemon must not hang
// every command.
const nixQueryTimeout = 30 * time.Second

// nixClosure resolves bin through its symbolic links. When it lands in the
// Nix store (NixOS profiles are links into it) it returns the resolved path,
// which is what runs inside the sandbox since the profile is not there, and
// the store paths it needs. Elsewhere it returns bin unchanged and no binds.
func (r *Runtime) nixClosure(bin string) (string, []string, error) {
	store := r.host.NixStore
	if !within(bin, store) {
		if fi, err := os.Lstat(bin); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			return bin, nil, nil //nolint:nilerr // not a link into the store: the binary is bound as it is
		}
	}
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return "", nil, fmt.Errorf("resolving command %s: %w", bin, err)
	}
	if !within(real, store) || real == store {
		return bin, nil, nil
	}

	r.mu.Lock()
	cached, ok := r.closures[real]
	r.mu.Unlock()
	if ok {
		return real, cached, nil
	}
	paths, err := r.storeRequisites(real)
	if err != nil {
		return "", nil, fmt.Errorf("resolving the Nix store requisites of %s: %w", real, err)
	}
	r.mu.Lock()
	r.closures[real] = paths
	r.mu.Unlock()
	return real, paths, nil
}

// storeRequisites asks nix-store when the host has it: it knows the
// closure exactly. Without it the closure is read from the files.
func (r *Runtime) storeRequisites(real string) ([]string, error) {
	query := r.host.NixStoreQuery
	if query == "" {
		for _, dir := range r.host.SearchPath {
			p := filepath.Join(dir, "nix-store")
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				query = p
				break
			}
		}
	}
	if query == "" {
		return elfClosure(r.host.NixStore, real)
	}
	return queryRequisites(query, r.host.NixStore, storePathOf(r.host.NixStore, real))
}

func queryRequisites(query, store, path string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), nixQueryTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, query, "--query", "--requisites", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s --query --requisites %s: %w: %s", query, path, err, strings.TrimSpace(stderr.String()))
	}
	var paths []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" {
			continue
		}
		// Anything but a top-level store path would bind something the
		// store does not vouch for.
		if filepath.Clean(p) != p || storePathOf(store, p) != p {
			return nil, fmt.Errorf("%s listed %q, which is not a path directly in %s", query, p, store)
		}
		paths = append(paths, p)
	}
	if !slices.Contains(paths, path) {
		paths = append(paths, path)
	}
	slices.Sort(paths)
	return slices.Compact(paths), nil
}

// storePathOf returns the top-level store path p is in: /nix/store/<hash>-<name>.
func storePathOf(store, p string) string {
	rest := strings.TrimPrefix(p, store+"/")
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	return store + "/" + rest
}

// elfClosure follows what the loader and the kernel follow: the script
// interpreter of a #! line, the ELF interpreter, and each needed library
// found in the RUNPATH (or RPATH) directories, recursively. It collects the
// store paths of everything it meets and of every RUNPATH directory.
func elfClosure(store, start string) ([]string, error) {
	paths := map[string]bool{}
	seen := map[string]bool{}
	queue := []string{start}
	add := func(p string) {
		if !within(p, store) || p == store {
			return
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil || !within(real, store) || real == store {
			return
		}
		paths[storePathOf(store, p)] = true
		paths[storePathOf(store, real)] = true
		if !seen[real] {
			seen[real] = true
			queue = append(queue, real)
		}
	}
	seen[start] = true
	paths[storePathOf(store, start)] = true
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		refs, err := fileReferences(f)
		if err != nil {
			return nil, err
		}
		for _, dir := range refs.dirs {
			if within(dir, store) && dir != store {
				paths[storePathOf(store, dir)] = true
			}
		}
		for _, p := range refs.files {
			add(p)
		}
		for _, lib := range refs.needed {
			for _, dir := range refs.dirs {
				p := filepath.Join(dir, lib)
				if _, err := os.Stat(p); err == nil {
					add(p)
					break
				}
			}
		}
	}
	out := make([]string, 0, len(paths))
	for p := range paths {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}

type references struct {
	// files are followed: interpreters.
	files []string
	// dirs are the library search directories.
	dirs []string
	// needed are the library names the loader looks up in dirs.
	needed []string
}

func fileReferences(path string) (references, error) {
	f, err := os.Open(path)
	if err != nil {
		return references{}, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	head := make([]byte, 256)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return references{}, fmt.Errorf("reading %s: %w", path, err)
	}
	head = head[:n]
	if interp, ok := shebang(head); ok {
		return references{files: []string{interp}}, nil
	}
	if !bytes.HasPrefix(head, []byte(elf.ELFMAG)) {
		return references{}, nil
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return references{}, fmt.Errorf("reading ELF file %s: %w", path, err)
	}
	var refs references
	for _, p := range ef.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		// An interpreter's path; PATH_MAX bounds what may be read.
		b, err := io.ReadAll(io.LimitReader(p.Open(), 4096))
		if err != nil {
			return references{}, fmt.Errorf("reading the interpreter of %s: %w", path, err)
		}
		refs.files = append(refs.files, string(bytes.TrimRight(b, "\x00")))
	}
	// The loader ignores RPATH when RUNPATH is present.
	search, err := ef.DynString(elf.DT_RUNPATH)
	if err == nil && len(search) == 0 {
		search, err = ef.DynString(elf.DT_RPATH)
	}
	if err != nil {
		// A static executable has no dynamic section: nothing to follow.
		return refs, nil
	}
	origin := filepath.Dir(path)
	for _, s := range search {
		for _, d := range filepath.SplitList(s) {
			d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", origin), "$ORIGIN", origin)
			if d != "" {
				refs.dirs = append(refs.dirs, filepath.Clean(d))
			}
		}
	}
	refs.needed, _ = ef.ImportedLibraries()
	return refs, nil
}

// shebang returns the interpreter of a "#!" script.
func shebang(head []byte) (string, bool) {
	rest, ok := bytes.CutPrefix(head, []byte("#!"))
	if !ok {
		return "", false
	}
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		rest = rest[:i]
	}
	fields := strings.Fields(string(rest))
	if len(fields) == 0 {
		return "", false
	}
	return fields[0], true
}
