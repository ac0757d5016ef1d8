package bwrap_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/internal/commandname"
	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/bwrap"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// sandbox is one ensured bwrap instance over fresh areas.
type sandbox struct {
	rt       *bwrap.Runtime
	in       runtimes.Instance
	agentDir string
	warnings *bytes.Buffer
}

// newSandbox ensures an instance for agent "bea" whose allowlist holds the
// test's tools. env is the runtime's own environment as the driver sees it.
func newSandbox(t *testing.T, spec v1alpha1.SandboxSpec, env map[string]string, host bwrap.Host) *sandbox {
	t.Helper()
	return newSandboxStarting(t, spec, env, host, "")
}

// newSandboxStarting is newSandbox with the driver's cgroup v1 start
// (bwrap.Config.CgroupV1Start).
func newSandboxStarting(t *testing.T, spec v1alpha1.SandboxSpec, env map[string]string, host bwrap.Host, start string) *sandbox {
	t.Helper()
	testenv.Binary(t, "bwrap", "install bubblewrap (hack/install-deps.sh); in CI a missing bwrap fails these tests")
	dir := testenv.SharedDir(t)
	warnings := &bytes.Buffer{}
	rt, err := bwrap.New(bwrap.Config{
		StateDir:  filepath.Join(dir, "state"),
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		Warnings:  warnings,
		Host:      host,
		// As the controller starts commands: with the starter beside
		// it, through it or moved in, whichever is faster here.
		Starter:       testenv.Starter(t),
		CgroupV1Start: start,
	})
	if err != nil {
		t.Fatal(err)
	}
	spec.Agent = "bea"
	if spec.Binaries == nil {
		spec.Binaries = []v1alpha1.BinaryName{"sh", "env", "stat", "head", "cat", "ls", "tr", "sort", "wc"}
	}
	in, err := instance.Standalone(&spec, instance.Host{AreasRoot: filepath.Join(dir, "areas"), Home: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Ensure(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), in.Name) })
	return &sandbox{rt: rt, in: in, agentDir: filepath.Join(dir, "areas", "bea"), warnings: warnings}
}

// exec runs argv and returns its exit code, stdout and stderr; a driver
// error fails the test.
func (s *sandbox) exec(t *testing.T, argv ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return st.Code, out.String(), errb.String()
}

func (s *sandbox) sh(t *testing.T, script string) (int, string, string) {
	t.Helper()
	return s.exec(t, "sh", "-c", script)
}

func TestStandardPathsAndModes(t *testing.T) {
	s := newSandbox(t, v1alpha1.SandboxSpec{}, nil, bwrap.Host{})
	cases := []struct {
		target   string
		area     string
		writable bool
	}{
		{"/workspace", "workspace", true},
		{"/memories", "memories", true},
		{"/blocks", "blocks", false},
		{"/skills", "skills", true},
		{"/tasks", "tasks", true},
	}
	for _, c := range cases {
		t.Run("path"+c.target, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(s.agentDir, c.area, "from-host"), []byte(c.area), 0o644); err != nil {
				t.Fatal(err)
			}
			code, out, stderr := s.sh(t, fmt.Sprintf(`cat %s/from-host && echo sandbox > %s/from-sandbox`, c.target, c.target))
			if !strings.HasPrefix(out, c.area) {
				t.Fatalf("%s does not show the host area %s: stdout %q stderr %q", c.target, c.area, out, stderr)
			}
			_, statErr := os.Stat(filepath.Join(s.agentDir, c.area, "from-sandbox"))
			if c.writable {
				if code != 0 || statErr != nil {
					t.Fatalf("%s must be read-write: exit %d, stderr %q, host file: %v", c.target, code, stderr, statErr)
				}
				return
			}
			if code == 0 || !strings.Contains(stderr, "Read-only file system") || !os.IsNotExist(statErr) {
				t.Fatalf("%s must be read-only: exit %d, stderr %q, host file: %v", c.target, code, stderr, statErr)
			}
		})
	}
}

func TestCommandStartsInWorkspaceWithHomeThere(t *testing.T) {
	s := newSandbox(t, v1alpha1.SandboxSpec{}, nil, bwrap.Host{})
	code, out, stderr := s.sh(t, `pwd; echo "$HOME"`)
	if code != 0 || out != "/workspace\n/workspace\n" {
		t.Fatalf("exit %d stdout %q stderr %q; want /workspace twice", code, out, stderr)
	}
}

func TestWritesOutsideReadWriteAreasFail(t *testing.T) {
	hostDir := testenv.SharedDir(t)
	spec := v1alpha1.SandboxSpec{Mounts: []v1alpha1.Mount{
		{Source: hostDir, Target: "ro-mount", Mode: v1alpha1.MountReadOnly},
	}}
	s := newSandbox(t, spec, nil, bwrap.Host{})
	for _, p := range []string{"/probe", "/usr/probe", "/etc/probe", "/bin/probe", "/lib/probe", "/blocks/probe", "/workspace/ro-mount/probe", "/proc/sys/vm/swappiness", "/nonexistent-dir/probe"} {
		t.Run("write-outside"+p, func(t *testing.T) {
			code, _, stderr := s.sh(t, fmt.Sprintf(`echo x > %s`, p))
			if code == 0 {
				t.Fatalf("writing %s succeeded", p)
			}
			if stderr == "" {
				t.Fatalf("writing %s failed without saying why", p)
			}
		})
	}
	entries, err := os.ReadDir(hostDir)
	if err != nil || len(entries) != 0 {
		t.Fatalf("the read-only mount's host directory changed: %v %v", entries, err)
	}
}

func TestCustomMountsAppearBelowWorkspaceWithTheirModes(t *testing.T) {
	roDir, rwDir := testenv.SharedDir(t), testenv.SharedDir(t)
	spec := v1alpha1.SandboxSpec{Mounts: []v1alpha1.Mount{
		{Source: roDir, Target: "docs", Mode: v1alpha1.MountReadOnly},
		{Source: rwDir, Target: "src/app", Mode: v1alpha1.MountReadWrite},
	}}
	s := newSandbox(t, spec, nil, bwrap.Host{})
	testenv.GiveTo(t, s.in.Identity.UID, rwDir)
	if err := os.WriteFile(filepath.Join(roDir, "readme"), []byte("ro"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := s.sh(t, `cat /workspace/docs/readme; echo rw > /workspace/src/app/out; echo no > /workspace/docs/out`)
	if out != "ro" || code == 0 || !strings.Contains(stderr, "Read-only file system") {
		t.Fatalf("want the ro mount readable and unwritable: exit %d stdout %q stderr %q", code, out, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(rwDir, "out")); err != nil || string(b) != "rw\n" {
		t.Fatalf("the rw mount's write did not reach the host: %q %v", b, err)
	}
}

func TestTmpIsFresh64MiBPerCommand(t *testing.T) {
	s := newSandbox(t, v1alpha1.SandboxSpec{}, nil, bwrap.Host{})
	code, out, stderr := s.exec(t, "stat", "-f", "-c", "%T %S %b", "/tmp")
	var fsType string
	var bsize, blocks int64
	if _, err := fmt.Sscan(out, &fsType, &bsize, &blocks); err != nil || code != 0 {
		t.Fatalf("stat /tmp: exit %d stdout %q stderr %q: %v", code, out, stderr, err)
	}
	if fsType != "tmpfs" || bsize*blocks != bwrap.TmpSize {
		t.Fatalf("/tmp is %s of %d bytes, want tmpfs of %d", fsType, bsize*blocks, bwrap.TmpSize)
	}
	if code, _, stderr := s.sh(t, `echo first > /tmp/marker`); code != 0 {
		t.Fatalf("writing /tmp: %s", stderr)
	}
	if code, _, _ := s.sh(t, `test -e /tmp/marker`); code == 0 {
		t.Fatalf("/tmp/marker of the previous command is still there: /tmp is not fresh per command")
	}
	code, _, stderr = s.sh(t, `head -c 70000000 /dev/zero > /tmp/big`)
	if code == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("writing 70 MB to /tmp: exit %d stderr %q; want it full at 64 MiB", code, stderr)
	}
}

// TestEveryMetacharacterAndSpaceIsRejected puts each forbidden character in
// a command the allowlist even names, and wants a refusal naming it before
// anything runs.
func TestEveryMetacharacterAndSpaceIsRejected(t *testing.T) {
	s := newSandbox(t, v1alpha1.SandboxSpec{}, nil, bwrap.Host{})
	for _, r := range commandname.ShellMetacharacters + " \t\n" {
		cmd := "sh" + string(r) + "x"
		t.Run(fmt.Sprintf("reject/%q", r), func(t *testing.T) {
			marker := filepath.Join(s.agentDir, "workspace", "ran")
			_, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: []string{cmd, "-c", "touch /workspace/ran"}})
			if runtimes.ReasonOf(err) != runtimes.ReasonRefused || !errors.Is(err, policy.ErrRefused) {
				t.Fatalf("exec %q: %v, want CommandRefused", cmd, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", r)) {
				t.Fatalf("refusal %q does not name %q", err, r)
			}
			if _, err := os.Stat(marker); !os.IsNotExist(err) {
				t.Fatalf("something ran: %v", err)
			}
		})
	}
}

func envSet(out string) []string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	slices.Sort(lines)
	return lines
}

func TestEnvironmentIsRebuiltFromNothing(t *testing.T) {
	runtimeEnv := map[string]string{
		"SECRET_TOKEN":  "must-not-leak",
		"LD_PRELOAD":    "/must/not/leak.so",
		"USER":          "root",
		"TERM":          "xterm",
		"PASS_ME":       "passed through",
		"ALSO_PASSED":   "yes",
		"KUBECONFIG":    "/root/.kube/config",
		"DBUS_ADDRESS":  "unix:path=/run/dbus",
		"LANG":          "en_US.UTF-8",
		"SSH_AUTH_SOCK": "/run/ssh",
	}
	spec := v1alpha1.SandboxSpec{Env: v1alpha1.Environment{Passthrough: []v1alpha1.EnvVarName{"PASS_ME", "ALSO_PASSED", "UNSET_IN_RUNTIME"}}}
	s := newSandbox(t, spec, runtimeEnv, bwrap.Host{})
	if err := os.WriteFile(filepath.Join(s.agentDir, "workspace", ".env"), []byte("# agent's values\nFROM_DOTENV=dotenv value\nexport QUOTED=\"a b\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The agent's own file: the runtime reads it as the agent.
	testenv.GiveTo(t, s.in.Identity.UID, filepath.Join(s.agentDir, "workspace", ".env"))
	code, out, stderr := s.exec(t, "env")
	if code != 0 {
		t.Fatalf("env: exit %d stderr %q", code, stderr)
	}
	// PWD is bwrap's, set by --chdir; nothing else may appear.
	want := []string{
		"ALSO_PASSED=yes", "FROM_DOTENV=dotenv value", "HOME=/workspace", "LANG=en_US.UTF-8",
		"PASS_ME=passed through", "PATH=" + policy.MinimalPath, "PWD=/workspace", "QUOTED=a b",
	}
	want = slices.Sorted(slices.Values(append(want, policy.GitConfig...)))
	if got := envSet(out); !slices.Equal(got, want) {
		t.Fatalf("the command's environment is\n  %q\nwant exactly\n  %q", got, want)
	}

	t.Run("malformed .env refuses the command naming the line", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(s.agentDir, "workspace", ".env"), []byte("A=1\n\nthis is not an assignment\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: []string{"env"}})
		if runtimes.ReasonOf(err) != runtimes.ReasonRefused || !strings.Contains(err.Error(), "line 3") {
			t.Fatalf("exec with a malformed .env: %v; want a refusal naming line 3", err)
		}
	})
	t.Run(".env linked out of the workspace is refused", func(t *testing.T) {
		outside := filepath.Join(t.TempDir(), "host.env")
		if err := os.WriteFile(outside, []byte("HOST_SECRET=1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		envPath := filepath.Join(s.agentDir, "workspace", ".env")
		os.Remove(envPath)
		if err := os.Symlink(outside, envPath); err != nil {
			t.Fatal(err)
		}
		_, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: []string{"env"}})
		if runtimes.ReasonOf(err) != runtimes.ReasonRefused || !strings.Contains(err.Error(), "escapes") {
			t.Fatalf("exec with .env linking out: %v; want a refusal", err)
		}
	})
	t.Run(".env setting a loader variable refuses the command", func(t *testing.T) {
		// A preload of the agent's own library would run its code in
		// every allowlisted command; the loader's debugging output shows
		// whether such a variable reaches one at all.
		envPath := filepath.Join(s.agentDir, "workspace", ".env")
		for _, line := range []string{"LD_PRELOAD=/workspace/agent.so", "LD_DEBUG=files", "GCONV_PATH=/workspace"} {
			os.Remove(envPath)
			if err := os.WriteFile(envPath, []byte(line+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			testenv.GiveTo(t, s.in.Identity.UID, envPath)
			var out, errb bytes.Buffer
			_, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: []string{"env"}, Stdout: &out, Stderr: &errb})
			name, _, _ := strings.Cut(line, "=")
			if runtimes.ReasonOf(err) != runtimes.ReasonRefused || !strings.Contains(err.Error(), name) {
				t.Errorf("exec with %q in .env: %v (stdout %q, stderr %q); want a refusal naming %s", line, err, out.String(), errb.String(), name)
			}
		}
	})
	t.Run("environment in the request is refused", func(t *testing.T) {
		os.Remove(filepath.Join(s.agentDir, "workspace", ".env"))
		_, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: []string{"env"}, Env: []string{"SNEAKY=1"}})
		if runtimes.ReasonOf(err) != runtimes.ReasonRefused {
			t.Fatalf("exec with request env: %v; want a refusal", err)
		}
	})
}

// TestDisableSwitch checks the three exact values run the command on the
// host in the workspace directory with the rebuilt environment and a
// warning, and that near misses keep the sandbox.
func TestDisableSwitch(t *testing.T) {
	const script = `pwd; echo "HOME=$HOME"; env | sort | tr '\n' ' '`
	cases := []struct {
		value    string
		disabled bool
	}{
		{"i-am-in-a-container", true},
		{"babe-i-brought-protection", true},
		{"we-are-literally-transbians-what", true},
		{"I-AM-IN-A-CONTAINER", false},
		{"i-am-in-a-container ", false},
		{" babe-i-brought-protection", false},
		{"we-are-literally-transbians-what\n", false},
		{"true", false},
		{"1", false},
		{"", false},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("disable=%q", c.value), func(t *testing.T) {
			env := map[string]string{policy.DisableSandboxEnv: c.value, "SECRET": "x", "PASS_ME": "p"}
			spec := v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"sh", "env", "sort", "tr"}, Env: v1alpha1.Environment{Passthrough: []v1alpha1.EnvVarName{"PASS_ME"}}}
			s := newSandbox(t, spec, env, bwrap.Host{})
			code, out, stderr := s.sh(t, script)
			if code != 0 {
				t.Fatalf("exit %d stderr %q", code, stderr)
			}
			lines := strings.SplitN(out, "\n", 3)
			hostWS := filepath.Join(s.agentDir, "workspace")
			if c.disabled {
				if lines[0] != hostWS || lines[1] != "HOME="+hostWS {
					t.Fatalf("unsandboxed command ran in %q with %q, want the host workspace %s", lines[0], lines[1], hostWS)
				}
				if !strings.Contains(s.warnings.String(), "SANDBOX IS DISABLED") {
					t.Fatalf("no warning on stderr: %q", s.warnings.String())
				}
			} else {
				if lines[0] != "/workspace" || lines[1] != "HOME=/workspace" {
					t.Fatalf("near miss %q left the sandbox: ran in %q with %q", c.value, lines[0], lines[1])
				}
				if s.warnings.Len() != 0 {
					t.Fatalf("warning printed for a near miss: %q", s.warnings.String())
				}
			}
			if strings.Contains(lines[2], "SECRET") || strings.Contains(lines[2], policy.DisableSandboxEnv) || !strings.Contains(lines[2], "PASS_ME=p") {
				t.Fatalf("environment is not the rebuilt one: %q", lines[2])
			}
		})
	}
	t.Run("disabled still enforces the allowlist", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{Binaries: []v1alpha1.BinaryName{"sh"}}, map[string]string{policy.DisableSandboxEnv: "i-am-in-a-container"}, bwrap.Host{})
		_, err := s.rt.Exec(context.Background(), s.in.Name, runtimes.ExecRequest{Argv: []string{"env"}})
		if runtimes.ReasonOf(err) != runtimes.ReasonRefused {
			t.Fatalf("exec of a command outside the allowlist with the sandbox disabled: %v", err)
		}
	})
}

// minimalDev is what bwrap's --dev creates.
var minimalDev = []string{"core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}

// hostOnlyDevice finds a device node of the host that the minimal /dev
// does not have.
func hostOnlyDevice(t *testing.T) string {
	t.Helper()
	entries, err := os.ReadDir("/dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeCharDevice != 0 && !slices.Contains(minimalDev, e.Name()) {
			return "/dev/" + e.Name()
		}
	}
	t.Fatalf("the host /dev has no device beyond the minimal set; cannot show devices.all")
	return ""
}

// fakeUSBBus makes a directory shaped like /dev/bus/usb with one node that
// behaves like /dev/null (major 1, minor 3), so that the test can show a
// USB node is usable inside on a host without USB.
func fakeUSBBus(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(testenv.SharedDir(t), "usb")
	if err := os.MkdirAll(filepath.Join(dir, "001"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(dir, "001", "002"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		testenv.Missing(t, "the privilege to create device nodes (root)", fmt.Sprintf("mknod: %v", err))
	}
	// Agents have ids of their own: a node they may use is open to them,
	// as a udev rule makes a real USB device (mknod's mode met the umask).
	if err := os.Chmod(filepath.Join(dir, "001", "002"), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDevices(t *testing.T) {
	hostDev := hostOnlyDevice(t)
	usbDir := fakeUSBBus(t)
	const listDev = `ls -A /dev | tr '\n' ' '`
	t.Run("devices/none by default: minimal /dev", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{}, nil, bwrap.Host{USBDevices: usbDir})
		_, out, _ := s.sh(t, listDev)
		if got := strings.Fields(out); !slices.Equal(got, minimalDev) {
			t.Fatalf("/dev holds %q, want the minimal %q", got, minimalDev)
		}
	})
	t.Run("devices/usb exposes the USB nodes and nothing else of the host /dev", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{Devices: v1alpha1.Devices{USB: true}}, nil, bwrap.Host{USBDevices: usbDir})
		code, out, stderr := s.sh(t, fmt.Sprintf(`echo data > /dev/bus/usb/001/002 && echo usable; test -e %s && echo leaked`, hostDev))
		if code == 0 && strings.Contains(out, "leaked") || !strings.Contains(out, "usable") {
			t.Fatalf("usb: stdout %q stderr %q; want the USB node usable and %s absent", out, stderr, hostDev)
		}
	})
	t.Run("devices/usb on this host's own /dev/bus/usb", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{Devices: v1alpha1.Devices{USB: true}}, nil, bwrap.Host{})
		code, out, stderr := s.sh(t, `ls /dev/bus/usb 2>/dev/null | wc -l`)
		hostEntries, _ := os.ReadDir("/dev/bus/usb")
		if code != 0 || strings.TrimSpace(out) != fmt.Sprint(len(hostEntries)) {
			t.Fatalf("usb with the host's bus: exit %d, %q entries inside, %d on the host; stderr %q", code, out, len(hostEntries), stderr)
		}
	})
	t.Run("devices/all exposes the host /dev", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{Devices: v1alpha1.Devices{All: true}}, nil, bwrap.Host{USBDevices: usbDir})
		code, out, stderr := s.sh(t, fmt.Sprintf(`test -c %s && echo present`, hostDev))
		if code != 0 || out != "present\n" {
			t.Fatalf("all: %s not visible: exit %d stdout %q stderr %q", hostDev, code, out, stderr)
		}
	})
	t.Run("devices/without usb there is no USB bus", func(t *testing.T) {
		s := newSandbox(t, v1alpha1.SandboxSpec{}, nil, bwrap.Host{USBDevices: usbDir})
		if code, _, _ := s.sh(t, `test -e /dev/bus/usb`); code == 0 {
			t.Fatalf("/dev/bus/usb exists without devices.usb")
		}
	})
}
