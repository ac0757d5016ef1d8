package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

type kind int

const (
	kindFile kind = iota
	kindDir
	kindSymlink
)

// entry is one file of a package or of the image.
type entry struct {
	kind kind
	mode fs.FileMode
	data []byte
	link string
	// from is the package the entry came from (for messages).
	from string
}

// tree maps clean relative paths (usr/bin/git) to entries.
type tree map[string]*entry

// multiarch is Debian's library directory triple of an architecture.
func multiarch(arch string) string {
	return map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[arch]
}

// resolve follows symbolic links within t from p; it returns the path of
// the file reached and every path on the way (p itself, the links and the
// file), so copying all of them keeps each name working in the image.
func (t tree) resolve(p string) (string, []string, error) {
	var chain []string
	for range 40 {
		e, ok := t[p]
		if !ok {
			return "", nil, fmt.Errorf("%s: not in any package", "/"+p)
		}
		chain = append(chain, p)
		if e.kind != kindSymlink {
			return p, chain, nil
		}
		target := e.link
		if !path.IsAbs(target) {
			target = path.Join("/"+path.Dir(p), target)
		}
		p = usrMerged(target)
	}
	return "", nil, fmt.Errorf("%s: too many levels of symbolic links", "/"+p)
}

// closure is the set of paths the given executables need: themselves,
// their ELF interpreter, and every shared library they load, transitively,
// found in the multiarch library directories the way ld.so finds them.
func (t tree) closure(arch string, roots ...string) (map[string]bool, error) {
	libDirs := []string{"usr/lib/" + multiarch(arch), "usr/lib"}
	keep := map[string]bool{}
	queue := append([]string(nil), roots...)
	neededBy := map[string]string{}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		file, chain, err := t.resolve(p)
		if err != nil {
			if by, ok := neededBy[p]; ok {
				return nil, fmt.Errorf("%s, needed by %s, is in none of the packages: add the package that ships it (dpkg -S %s on a Debian host)", "/"+p, by, path.Base(p))
			}
			return nil, err
		}
		seen := keep[file]
		for _, c := range chain {
			keep[c] = true
		}
		if seen {
			continue
		}
		needed, interp, err := elfDeps(t[file].data)
		if err != nil {
			return nil, fmt.Errorf("reading /%s: %w", file, err)
		}
		if interp != "" {
			ip := usrMerged(interp)
			neededBy[ip] = "/" + file
			queue = append(queue, ip)
		}
		for _, lib := range needed {
			found := ""
			for _, d := range libDirs {
				if _, ok := t[path.Join(d, lib)]; ok {
					found = path.Join(d, lib)
					break
				}
			}
			if found == "" {
				return nil, fmt.Errorf("%s, needed by /%s, is in none of the packages: add the package that ships it (dpkg -S %s on a Debian host)", lib, file, lib)
			}
			neededBy[found] = "/" + file
			queue = append(queue, found)
		}
	}
	return keep, nil
}

// elfDeps returns an ELF file's DT_NEEDED libraries and its interpreter.
func elfDeps(data []byte) (needed []string, interp string, err error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return nil, "", fmt.Errorf("reading the interpreter: %w", err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	needed, err = f.ImportedLibraries()
	return needed, interp, err
}

// isStatic says whether an ELF executable needs no loader and no library.
func isStatic(data []byte) (bool, error) {
	needed, interp, err := elfDeps(data)
	return err == nil && interp == "" && len(needed) == 0, err
}

// subtree adds to keep every path of t below dir.
func (t tree) subtree(keep map[string]bool, dir string) {
	for p := range t {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			keep[p] = true
		}
	}
}

// sortedPaths returns the paths of keep with every parent directory, sorted
// so a directory comes before its contents.
func sortedPaths(keep map[string]bool) []string {
	all := map[string]bool{}
	for p := range keep {
		for q := p; q != "." && q != ""; q = path.Dir(q) {
			all[q] = true
		}
	}
	out := make([]string, 0, len(all))
	for p := range all {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
