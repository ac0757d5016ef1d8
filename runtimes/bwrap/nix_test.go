package bwrap

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"debug/elf"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// elfSpec is what a synthetic ELF file declares to the loader.
type elfSpec struct {
	interp  string
	runpath string
	rpath   string
	needed  []string
}

// writeELF writes a minimal 64-bit ELF file carrying an interpreter
// (PT_INTERP) and a dynamic section with DT_NEEDED, DT_RPATH and
// DT_RUNPATH entries: just enough for the loader-following closure, which
// is all the synthetic store needs.
func writeELF(t *testing.T, path string, spec elfSpec) {
	t.Helper()
	le := binary.LittleEndian
	var dynstr bytes.Buffer
	dynstr.WriteByte(0)
	str := func(s string) uint64 {
		off := dynstr.Len()
		dynstr.WriteString(s)
		dynstr.WriteByte(0)
		return uint64(off)
	}
	var dyn []elf.Dyn64
	for _, n := range spec.needed {
		dyn = append(dyn, elf.Dyn64{Tag: int64(elf.DT_NEEDED), Val: str(n)})
	}
	if spec.rpath != "" {
		dyn = append(dyn, elf.Dyn64{Tag: int64(elf.DT_RPATH), Val: str(spec.rpath)})
	}
	if spec.runpath != "" {
		dyn = append(dyn, elf.Dyn64{Tag: int64(elf.DT_RUNPATH), Val: str(spec.runpath)})
	}
	dyn = append(dyn, elf.Dyn64{Tag: int64(elf.DT_NULL)})
	var dynBuf bytes.Buffer
	for _, d := range dyn {
		_ = binary.Write(&dynBuf, le, d)
	}
	shstr := []byte("\x00.interp\x00.dynstr\x00.dynamic\x00.shstrtab\x00")
	interp := append([]byte(spec.interp), 0)

	const ehsize, phsize, shsize = 64, 56, 64
	phnum := 0
	if spec.interp != "" {
		phnum = 1
	}
	interpOff := uint64(ehsize + phsize*phnum)
	dynstrOff := interpOff + uint64(len(interp))
	dynOff := dynstrOff + uint64(dynstr.Len())
	shstrOff := dynOff + uint64(dynBuf.Len())
	shOff := shstrOff + uint64(len(shstr))

	var f bytes.Buffer
	hdr := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Phoff: ehsize, Shoff: shOff, Ehsize: ehsize, Phentsize: phsize, Phnum: uint16(phnum),
		Shentsize: shsize, Shnum: 5, Shstrndx: 4,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	_ = binary.Write(&f, le, hdr)
	if phnum == 1 {
		_ = binary.Write(&f, le, elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: interpOff, Filesz: uint64(len(interp)), Memsz: uint64(len(interp)), Align: 1})
	}
	f.Write(interp)
	f.Write(dynstr.Bytes())
	f.Write(dynBuf.Bytes())
	f.Write(shstr)
	sections := []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Off: interpOff, Size: uint64(len(interp)), Addralign: 1},
		{Name: 9, Type: uint32(elf.SHT_STRTAB), Off: dynstrOff, Size: uint64(dynstr.Len()), Addralign: 1},
		{Name: 17, Type: uint32(elf.SHT_DYNAMIC), Off: dynOff, Size: uint64(dynBuf.Len()), Link: 2, Addralign: 8, Entsize: 16},
		{Name: 26, Type: uint32(elf.SHT_STRTAB), Off: shstrOff, Size: uint64(len(shstr)), Addralign: 1},
	}
	for _, s := range sections {
		_ = binary.Write(&f, le, s)
	}
	mkfile(t, path, f.Bytes(), 0o755)
}

func mkfile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

func TestWriteELFIsReadable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x")
	writeELF(t, p, elfSpec{interp: "/s/ld.so", runpath: "/a:/b", rpath: "/c", needed: []string{"libx.so", "liby.so"}})
	refs, err := fileReferences(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(refs.files, []string{"/s/ld.so"}) || !slices.Equal(refs.dirs, []string{"/a", "/b"}) || !slices.Equal(refs.needed, []string{"libx.so", "liby.so"}) {
		t.Fatalf("references %+v", refs)
	}
}

// syntheticStore builds a Nix-like store: an application with a loader,
// libraries found through RUNPATH, $ORIGIN and RPATH, a wrapper script, a
// profile link, and store paths that nothing needs.
func syntheticStore(t *testing.T) (store, profile string) {
	t.Helper()
	root := t.TempDir()
	store = filepath.Join(root, "nix", "store")
	s := func(p string) string { return filepath.Join(store, p) }
	writeELF(t, s("h1-glibc/lib/ld-linux-x86-64.so.2"), elfSpec{})
	writeELF(t, s("h1-glibc/lib/libc.so.6"), elfSpec{})
	writeELF(t, s("h2-zlib/lib/libz.so.1"), elfSpec{runpath: s("h1-glibc/lib"), needed: []string{"libc.so.6"}})
	writeELF(t, s("h3-app/bin/app"), elfSpec{
		interp:  s("h1-glibc/lib/ld-linux-x86-64.so.2"),
		runpath: s("h2-zlib/lib") + ":$ORIGIN/../lib:" + s("h6-search-only/lib"),
		needed:  []string{"libz.so.1", "libapp.so", "libc.so.6"},
	})
	writeELF(t, s("h3-app/lib/libapp.so"), elfSpec{rpath: s("h4-ssl/lib"), needed: []string{"libssl.so"}})
	// RUNPATH wins over RPATH: h5 must not be part of the closure.
	writeELF(t, s("h4-ssl/lib/libssl.so"), elfSpec{runpath: s("h1-glibc/lib"), rpath: s("h5-unrelated/lib"), needed: []string{"libc.so.6"}})
	writeELF(t, s("h5-unrelated/lib/libssl.so"), elfSpec{})
	if err := os.MkdirAll(s("h6-search-only/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	mkfile(t, s("h7-app-wrapped/bin/app"), []byte("#!"+s("h3-app/bin/app")+" --wrapped\n"), 0o755)
	if err := os.MkdirAll(s("h8-env/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(s("h7-app-wrapped/bin/app"), s("h8-env/bin/app")); err != nil {
		t.Fatal(err)
	}
	profile = filepath.Join(root, "profile", "bin")
	if err := os.MkdirAll(profile, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(s("h8-env/bin/app"), filepath.Join(profile, "app")); err != nil {
		t.Fatal(err)
	}
	return store, profile
}

func TestNixClosureFromELF(t *testing.T) {
	store, profile := syntheticStore(t)
	r := &Runtime{host: Host{SearchPath: []string{profile}, NixStore: store}.withDefaults(), closures: map[string][]string{}}
	bin, err := r.lookHost("app")
	if err != nil {
		t.Fatal(err)
	}
	real, paths, err := r.nixClosure(bin)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(store, "h7-app-wrapped/bin/app"); real != want {
		t.Fatalf("resolved %s, want %s", real, want)
	}
	var names []string
	for _, p := range paths {
		names = append(names, strings.TrimPrefix(p, store+"/"))
	}
	want := []string{"h1-glibc", "h2-zlib", "h3-app", "h4-ssl", "h6-search-only", "h7-app-wrapped"}
	if !slices.Equal(names, want) {
		t.Fatalf("closure %q, want %q", names, want)
	}
}

func TestNixClosureOutsideTheStoreIsNothing(t *testing.T) {
	store, _ := syntheticStore(t)
	r := &Runtime{host: Host{NixStore: store}.withDefaults(), closures: map[string][]string{}}
	bin, err := r.lookHost("sh")
	if err != nil {
		t.Fatal(err)
	}
	got, paths, err := r.nixClosure(bin)
	if err != nil || got != bin || paths != nil {
		t.Fatalf("nixClosure(%s) = %s, %q, %v; want the command unchanged and no binds", bin, got, paths, err)
	}
}

// runnableStore puts a real shell in a synthetic store, a tool script that
// runs with it, a data path only nix-store knows the tool needs, and an
// unrelated path.
func runnableStore(t *testing.T) (store, profile string) {
	t.Helper()
	root := testenv.SharedDir(t)
	store = filepath.Join(root, "nix", "store")
	dash, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	mkfile(t, filepath.Join(store, "a1-sh/bin/sh"), dash, 0o755)
	mkfile(t, filepath.Join(store, "c3-data/share/msg"), []byte("data from the store\n"), 0o644)
	mkfile(t, filepath.Join(store, "d4-unrelated/secret"), []byte("unrelated\n"), 0o644)
	script := "#!" + filepath.Join(store, "a1-sh/bin/sh") + "\n" +
		// Shell built-ins only: the sandbox's command directories hold
		// nothing but the allowlist.
		"for p in " + store + "/*; do printf '%s ' \"${p##*/}\"; done; echo\n" +
		"if [ -r " + filepath.Join(store, "c3-data/share/msg") + " ]; then while IFS= read -r l; do echo \"$l\"; done < " + filepath.Join(store, "c3-data/share/msg") + "; else echo no-data; fi\n"
	mkfile(t, filepath.Join(store, "b2-tool/bin/tool"), []byte(script), 0o755)
	profile = filepath.Join(root, "profile", "bin")
	if err := os.MkdirAll(profile, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(store, "b2-tool/bin/tool"), filepath.Join(profile, "tool")); err != nil {
		t.Fatal(err)
	}
	return store, profile
}

func runTool(t *testing.T, host Host) string {
	t.Helper()
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh); in CI a missing bwrap fails these tests")
	dir := t.TempDir()
	rt, err := New(Config{StateDir: filepath.Join(dir, "state"), LookupEnv: func(string) (string, bool) { return "", false }, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	in, err := instance.Standalone(&v1alpha1.SandboxSpec{Agent: "nix", Binaries: []v1alpha1.BinaryName{"tool"}}, instance.Host{AreasRoot: filepath.Join(dir, "areas")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
	var out, stderr bytes.Buffer
	st, err := rt.Exec(context.Background(), in.Name, runtimes.ExecRequest{Argv: []string{"tool"}, Stdout: &out, Stderr: &stderr})
	if err != nil || st.Code != 0 {
		t.Fatalf("tool: %v, exit %d, stderr %q", err, st.Code, stderr.String())
	}
	return out.String()
}

func TestNixClosureInSandboxWithoutNixStore(t *testing.T) {
	store, profile := runnableStore(t)
	out := runTool(t, Host{SearchPath: []string{profile}, NixStore: store, NixStoreQuery: ""})
	if want := "a1-sh b2-tool \nno-data\n"; out != want {
		t.Fatalf("inside the sandbox the store holds / the tool printed %q, want %q: only the tool and its interpreter are bound", out, want)
	}
}

func TestNixClosureInSandboxWithNixStoreQuery(t *testing.T) {
	store, profile := runnableStore(t)
	query := filepath.Join(t.TempDir(), "nix-store")
	fake := "#!/bin/sh\n" +
		`[ "$1 $2 $3" = "--query --requisites ` + filepath.Join(store, "b2-tool") + `" ] || { echo "unexpected: $*" >&2; exit 2; }` + "\n" +
		"echo " + filepath.Join(store, "b2-tool") + "\n" +
		"echo " + filepath.Join(store, "a1-sh") + "\n" +
		"echo " + filepath.Join(store, "c3-data") + "\n"
	mkfile(t, query, []byte(fake), 0o755)
	out := runTool(t, Host{SearchPath: []string{profile}, NixStore: store, NixStoreQuery: query})
	if want := "a1-sh b2-tool c3-data \ndata from the store\n"; out != want {
		t.Fatalf("the tool printed %q, want %q: nix-store's requisites bound, nothing else", out, want)
	}
}

func TestNixStoreQueryOutputIsChecked(t *testing.T) {
	store, _ := runnableStore(t)
	query := filepath.Join(t.TempDir(), "nix-store")
	mkfile(t, query, []byte("#!/bin/sh\necho /etc\n"), 0o755)
	_, err := queryRequisites(query, store, filepath.Join(store, "b2-tool"))
	if err == nil || !strings.Contains(err.Error(), "not a path directly in") {
		t.Fatalf("queryRequisites with a path outside the store: %v", err)
	}
}
