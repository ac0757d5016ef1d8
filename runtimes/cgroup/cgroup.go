//go:build linux

// Package cgroup gives each sandbox instance a cgroup of its own, below a
// parent the controller owns, with its CPU, memory and pids limits, and
// starts commands inside it with no moment outside: on cgroup v2 the
// child is cloned straight into the cgroup (CLONE_INTO_CGROUP); on cgroup
// v1 the child is a small starter that moves itself in and becomes the
// command (Manager.Starter), or, without one, the child is stopped at its
// first instruction (it asks to be traced), moved in, and let go.
//
// It never writes outside the cgroups below its parent, and never moves a
// process other than a command it starts: the controller itself never
// joins an instance's cgroup. A process whose one job is the command it
// starts (sandboxctl run) may ask for the faster v1 start instead
// (Manager.JoinToStart): its starting thread joins the instance's cgroups
// for the fork and leaves at once.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/fdfile"
)

// Mount is where the cgroup file systems are mounted.
const Mount = "/sys/fs/cgroup"

// Limits are what one instance's commands may use together; zero is no
// limit.
type Limits struct {
	CPUMillis   int64
	MemoryBytes int64
	Pids        int64
	// CPURequestMillis sets the CPU weight (shares) relative to others.
	CPURequestMillis int64
}

// ErrUnavailable is wrapped when the host offers no cgroup the controller
// can use for limits (no controllers, no permission).
var ErrUnavailable = errors.New("no usable cgroup for resource limits")

// v1Controllers are the hierarchies a v1 host must offer.
var v1Controllers = []string{"pids", "memory", "cpu", "cpuacct"}

// Manager creates and removes instance cgroups below one parent.
type Manager struct {
	// V2 says the host runs the unified hierarchy.
	V2 bool
	// dirs are the parent's directories: one per v1 controller, or the
	// one v2 directory under "".
	dirs map[string]string
	// kubelets says the parent is a Pod's cgroup (Pods.Manager): it is
	// the kubelet's, and never removed here.
	kubelets bool
	// JoinToStart starts commands on cgroup v1 from a thread that joins
	// the instance's cgroups for the fork and leaves right after, instead
	// of moving the stopped child in. Moving another process waits for
	// the kernel's global cgroup lock and an RCU grace period (5 to 15 ms
	// a start on these hosts); a thread moving itself takes neither (0.1
	// ms). For that instant the process is one of the instance's: a Stop
	// at the same moment kills it, the instance's OOM killer may choose
	// it, and the thread counts against the pids limit (the limit's last
	// pid cannot be started this way). That is for a process whose one
	// job is the command (a one-shot sandboxctl run), never for the
	// controller. The caller runs Start on a goroutine that ends after it
	// (StartOnOwnThread): a thread that cannot leave the instance's
	// cgroups stays locked to it and ends with it.
	JoinToStart bool
	// Starter is the path of the starter (cmd/sandbox-holder, see
	// starter.go) commands start through on cgroup v1: forked outside,
	// it moves itself into the instance's cgroups and becomes the
	// command, sparing the 5 to 15 ms of moving a stopped child by its
	// pid. Empty: the stopped child is moved.
	Starter string
	// usage keeps the instances' usage files open (usageFiles).
	usage *usageFiles
	// swap says the kernel accounts swap in the parent's memory cgroup
	// (swapAccounted): a memory limit then forbids swap beyond it, and
	// the memory used counts what is swapped.
	swap bool
	// tcp says the parent's memory cgroup has a TCP buffer limit of its
	// own (cgroup v1, tcpLimited).
	tcp bool
}

// New prepares the parent named name: below this process's own cgroup
// (each hierarchy's, on v1), or below parent when it is not empty (a path
// from the root of the hierarchy, as --cgroup-parent gives it).
func New(name, parent string) (*Manager, error) {
	v2, err := unified()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	m := &Manager{V2: v2, dirs: map[string]string{}, usage: newUsageFiles()}
	if m.V2 {
		return m, m.newV2(name, parent, own[""])
	}
	for _, c := range v1Controllers {
		base := own[c]
		if parent != "" {
			base = parent
		}
		if _, err := os.Stat(filepath.Join(Mount, c, "tasks")); err != nil {
			return nil, fmt.Errorf("%w: the %s controller is not mounted at %s: %w", ErrUnavailable, c, filepath.Join(Mount, c), err)
		}
		dir := filepath.Join(Mount, c, base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("%w: creating %s: %w", ErrUnavailable, dir, err)
		}
		m.dirs[c] = dir
	}
	m.swap = swapAccounted(false, m.dirs["memory"])
	m.tcp = tcpLimited(false, m.dirs["memory"])
	return m, nil
}

// unified says whether the host runs the unified hierarchy (cgroup v2)
// at Mount.
func unified() (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(Mount, &st); err != nil {
		return false, fmt.Errorf("%w: %s: %w", ErrUnavailable, Mount, err)
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC, nil
}

func (m *Manager) newV2(name, parent, own string) error {
	base := own
	if parent != "" {
		base = parent
	}
	dir := filepath.Join(Mount, base, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%w: creating %s: %w", ErrUnavailable, dir, err)
	}
	// Controllers are given down from the root of the hierarchy; a cgroup
	// with processes of its own cannot pass them on, so this process's
	// own cgroup (the default base) must be a leaf of its own: the
	// controller moves itself into one first.
	if parent == "" {
		leaf := filepath.Join(Mount, own, "sandbox-controller")
		if err := enable(filepath.Join(Mount, own)); err != nil && errors.Is(err, unix.EBUSY) {
			if err := os.MkdirAll(leaf, 0o755); err != nil {
				return fmt.Errorf("%w: creating %s: %w", ErrUnavailable, leaf, err)
			}
			if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
				return fmt.Errorf("%w: moving the controller into %s: %w", ErrUnavailable, leaf, err)
			}
		}
	}
	for d := filepath.Join(Mount, base); ; d = filepath.Dir(d) {
		if err := enable(d); err != nil {
			return fmt.Errorf("%w: giving the cpu, memory and pids controllers to %s: %w", ErrUnavailable, d, err)
		}
		if d == Mount || d == "/" {
			break
		}
	}
	if err := enable(dir); err != nil {
		return fmt.Errorf("%w: giving the cpu, memory and pids controllers to %s: %w", ErrUnavailable, dir, err)
	}
	m.dirs[""] = dir
	m.swap = swapAccounted(true, dir)
	return nil
}

// swapAccounted says whether the kernel accounts swap in the memory
// cgroup dir (not the root of a hierarchy, which has no swap files on
// v2): a kernel built without it, or booted with swapaccount=0 (v1) or
// cgroup.memory=noswap (v2), has neither memory.memsw.* nor
// memory.swap.*, and a memory limit cannot keep a process from swap.
func swapAccounted(v2 bool, dir string) bool {
	_, err := os.Stat(filepath.Join(dir, swapUsageFile(v2)))
	return err == nil
}

// tcpLimited says whether the memory cgroup dir has a TCP buffer limit
// apart from its memory limit: cgroup v1 charges a cgroup's sockets to
// nothing until that limit is set, so without it a command queues what it
// likes on TCP connections (a gigabyte under a 128 MiB limit, on loopback
// in its own network namespace) and every TCP user of the host meets the
// kernel's memory pressure. cgroup v2 charges sockets to the memory limit.
func tcpLimited(v2 bool, dir string) bool {
	if v2 {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, tcpLimitFile))
	return err == nil
}

// tcpLimitFile bounds a v1 memory cgroup's TCP buffers.
const tcpLimitFile = "memory.kmem.tcp.limit_in_bytes"

// swapUsageFile is the file that counts a cgroup's swap: on v1 memory
// and swap together, on v2 swap alone.
func swapUsageFile(v2 bool) string {
	if v2 {
		return "memory.swap.current"
	}
	return "memory.memsw.usage_in_bytes"
}

// SwapAccounted says whether the kernel accounts swap in this process's
// memory cgroup, where a runtime's containers are made: as containerd's
// CRI plugin asks before it gives runc a swap limit (runc fails to
// write one the kernel does not have).
func SwapAccounted() bool {
	v2, err := unified()
	if err != nil {
		return false
	}
	own, err := ownCgroups()
	if err != nil {
		return false
	}
	if v2 {
		return swapAccounted(true, filepath.Join(Mount, own[""]))
	}
	return swapAccounted(false, filepath.Join(Mount, "memory"))
}

// enable passes the cpu, memory and pids controllers on to dir's children.
func enable(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0)
}

// ownCgroups reads this process's cgroups: per v1 controller, and the v2
// one under "".
func ownCgroups() (map[string]string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer f.Close()
	out := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, s.Err()
}

// Dir is instance name's cgroup directory of controller c ("" on v2).
func (m *Manager) Dir(c, name string) string {
	if m.V2 {
		c = ""
	}
	return filepath.Join(m.dirs[c], name)
}

// Dirs are instance name's cgroup directories: one per v1 controller,
// or its one v2 directory.
func (m *Manager) Dirs(name string) []string {
	if m.V2 {
		return []string{m.Dir("", name)}
	}
	dirs := make([]string, 0, len(v1Controllers))
	for _, c := range v1Controllers {
		dirs = append(dirs, m.Dir(c, name))
	}
	return dirs
}

// Exists reports whether instance name's cgroup is there (a reboot or an
// administrator may have removed it since Ensure).
func (m *Manager) Exists(name string) bool {
	for c := range m.dirs {
		if _, err := os.Stat(filepath.Join(m.dirs[c], name)); err != nil {
			return false
		}
	}
	return true
}

// Ensure creates instance name's cgroup when missing and sets its limits.
func (m *Manager) Ensure(name string, l Limits) error {
	for c := range m.dirs {
		dir := filepath.Join(m.dirs[c], name)
		var err error
		if m.kubelets {
			// Never the kubelet's Pod cgroup itself, should it be gone.
			if err = os.Mkdir(dir, 0o755); errors.Is(err, fs.ErrExist) {
				err = nil
			}
		} else if err = os.Mkdir(dir, 0o755); errors.Is(err, fs.ErrExist) {
			err = nil
		} else if errors.Is(err, fs.ErrNotExist) {
			// The parent is missing too: made again since New.
			err = os.MkdirAll(dir, 0o755)
		}
		if err != nil {
			return fmt.Errorf("creating the cgroup of %s: %w", name, err)
		}
	}
	// Files kept open from a cgroup of the same name that went and was
	// made again would read the old one.
	m.forgetUsageFiles(name)
	if m.V2 {
		// The parent may have been made again since New (Remove prunes it).
		if err := enable(m.dirs[""]); err != nil {
			return fmt.Errorf("giving the cpu, memory and pids controllers to %s: %w", m.dirs[""], err)
		}
	}
	for _, set := range m.settings(l, m.raisesMemory(name, l)) {
		c, base, _ := strings.Cut(set.file, "/")
		p := filepath.Join(m.Dir(c, name), base)
		// A value the file holds already is not written again: a write
		// of cgroup v1's CPU bandwidth takes a millisecond or more, and
		// a new cgroup holds the "no limit" values already.
		if cur, err := readFile(p); err == nil && strings.TrimSpace(cur) == set.value {
			continue
		}
		if err := fdfile.Write(p, []byte(set.value)); err != nil {
			return fmt.Errorf("setting %s of %s to %s: %w", base, name, set.value, err)
		}
	}
	return nil
}

// raisesMemory says whether l lifts instance name's memory limit above
// the one it has (a new cgroup has none: l lowers it).
func (m *Manager) raisesMemory(name string, l Limits) bool {
	if l.MemoryBytes <= 0 {
		return true
	}
	if m.V2 {
		return false // no order to keep
	}
	cur, err := readFile(filepath.Join(m.Dir("memory", name), "memory.limit_in_bytes"))
	if err != nil {
		return false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(cur), 10, 64)
	return err == nil && l.MemoryBytes > n
}

// CFSQuota is the CFS quota (µs a period) of a CPU limit of millis
// thousandths of a CPU, at least the kernel's smallest (1 ms); 0 for no
// limit: none set, or more than the largest quota the kernel takes (its
// bandwidth fits in 44 bits: 176 million CPUs, which no host has), never
// a quota the kernel refuses or one wrapped around to 1% of a CPU.
func CFSQuota(millis, period int64) int64 {
	const maxQuota = 1<<44 - 1
	if millis <= 0 || millis > maxQuota/period*1000 {
		return 0
	}
	return max(millis*period/1000, 1000)
}

// maxShares is the largest v1 CPU weight: a larger request gets it.
const maxShares = 262144

// setting is an interface file ("controller/file") and its value.
type setting struct{ file, value string }

// settings are the files that set l and their values, in the order they
// are written; raising says l lifts the memory limit the cgroup has.
//
// A memory limit forbids swap beyond it where the kernel accounts swap:
// a process over its limit would otherwise be swapped out, not killed,
// and the memory it uses would not count what is swapped. On v2 the
// swap limit is apart from the memory one (0); on v1 it is of memory
// and swap together (memory.memsw.limit_in_bytes, the memory limit), and
// the kernel refuses, at every write, a memory limit above it: a limit
// lowered is written before its memsw, one raised after.
func (m *Manager) settings(l Limits, raising bool) []setting {
	pids, mem, swap := "max", "max", "max"
	if l.Pids > 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	if l.MemoryBytes > 0 {
		mem, swap = strconv.FormatInt(l.MemoryBytes, 10), "0"
	}
	const period = 100000
	quota := "max"
	if q := CFSQuota(l.CPUMillis, period); q > 0 {
		quota = strconv.FormatInt(q, 10)
	}
	if m.V2 {
		out := []setting{{"/pids.max", pids}, {"/memory.max", mem}, {"/cpu.max", quota + " " + strconv.Itoa(period)}}
		if m.swap {
			out = append(out, setting{"/memory.swap.max", swap})
		}
		// cgroup v2 weight 1..10000, 100 for one core as Kubernetes maps
		// it; without a request the kernel's default, so a request taken
		// away leaves no weight behind.
		weight := "100"
		if l.CPURequestMillis > 0 {
			weight = strconv.FormatInt(min(max(l.CPURequestMillis/10, 1), 10000), 10)
		}
		return append(out, setting{"/cpu.weight", weight})
	}
	if mem == "max" {
		mem = "-1"
	}
	if quota == "max" {
		quota = "-1"
	}
	memory := []setting{{"memory/memory.limit_in_bytes", mem}}
	if m.swap {
		memsw := setting{"memory/memory.memsw.limit_in_bytes", mem}
		if raising {
			memory = []setting{memsw, memory[0]}
		} else {
			memory = append(memory, memsw)
		}
	}
	if m.tcp {
		// Counted apart from memory: the TCP buffers get as much again.
		memory = append(memory, setting{"memory/" + tcpLimitFile, mem})
	}
	out := append([]setting{{"pids/pids.max", pids}}, memory...)
	out = append(out, setting{"cpu/cpu.cfs_period_us", strconv.Itoa(period)}, setting{"cpu/cpu.cfs_quota_us", quota})
	shares := "1024"
	if l.CPURequestMillis > 0 {
		shares = strconv.FormatInt(max(min(l.CPURequestMillis, maxShares*1000/1024)*1024/1000, 2), 10)
	}
	return append(out, setting{"cpu/cpu.shares", shares})
}

// Start starts cmd inside instance name's cgroup: the command and every
// process it makes are in it from their first instruction.
func (m *Manager) Start(name string, cmd *exec.Cmd) error {
	if m.V2 {
		fd, err := unix.Open(m.Dir("", name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening the cgroup of %s: %w", name, err)
		}
		defer unix.Close(fd)
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		return atPidsLimit(cmd.Start(), name)
	}
	if m.JoinToStart {
		return m.startJoined(name, cmd)
	}
	if m.Starter != "" {
		return m.startVia(name, cmd)
	}
	return m.startV1(name, cmd)
}

// startJoined starts cmd from this goroutine's thread inside instance
// name's cgroups: the thread writes 0 (itself) into each hierarchy's
// tasks, forks, and goes back to its own cgroups. A cgroup it cannot
// leave keeps the thread locked (see JoinToStart).
func (m *Manager) startJoined(name string, cmd *exec.Cmd) error {
	runtime.LockOSThread()
	own, err := threadCgroups()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	var joined []string
	leave := func() error {
		for _, c := range joined {
			if err := os.WriteFile(filepath.Join(Mount, c, own[c], "tasks"), []byte("0"), 0); err != nil {
				return fmt.Errorf("leaving the %s cgroup of %s after starting %s: %w", c, name, cmd.Path, err)
			}
		}
		runtime.UnlockOSThread()
		return nil
	}
	for _, c := range v1Controllers {
		if err := os.WriteFile(filepath.Join(m.Dir(c, name), "tasks"), []byte("0"), 0); err != nil {
			return errors.Join(fmt.Errorf("joining the %s cgroup of %s to start %s: %w", c, name, cmd.Path, err), leave())
		}
		joined = append(joined, c)
	}
	err = atPidsLimit(cmd.Start(), name)
	if lerr := leave(); lerr != nil {
		if err == nil {
			// This thread ends with its goroutine, and a command that
			// asked to die with its parent (bwrap) would die with it.
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return errors.Join(err, lerr)
	}
	return err
}

// atPidsLimit names the pids limit of instance name in a start refused
// by it (a fork inside the cgroup fails with EAGAIN).
func atPidsLimit(err error, name string) error {
	if errors.Is(err, syscall.EAGAIN) {
		return fmt.Errorf("%w (the pids limit of %s is reached)", err, name)
	}
	return err
}

// StartOnOwnThread calls start on a goroutine of its own and waits for
// it: the goroutine ends after, so a thread start left locked (a
// JoinToStart thread that could not leave an instance's cgroups) ends
// with it and is never used again.
func StartOnOwnThread(start func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- start() }()
	return <-ch
}

// threadCgroups reads the calling thread's v1 cgroups, by controller.
func threadCgroups() (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/cgroup", unix.Gettid()))
	if err != nil {
		return nil, fmt.Errorf("reading this thread's cgroups: %w", err)
	}
	own := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	for _, c := range v1Controllers {
		if _, ok := own[c]; !ok {
			return nil, fmt.Errorf("this thread is in no %s cgroup", c)
		}
	}
	return own, nil
}

// startV1 starts cmd stopped at its first instruction, moves it into
// instance name's cgroups and lets it go. The child asks to be traced
// (PTRACE_TRACEME), so the kernel stops it as soon as its exec is done;
// this process never joins an instance's cgroups itself. (A controller
// thread inside them would be charged to the instance's memory, could be
// chosen by its OOM killer, and would be listed, and killed, with the
// instance's processes.)
func (m *Manager) startV1(name string, cmd *exec.Cmd) error {
	return startStopped(cmd, func(c string) string { return m.Dir(c, name) }, name)
}

// startStopped starts cmd stopped at its first instruction, moves it by
// its pid into dir(c) of each v1 hierarchy c and lets it go; owner names
// those cgroups' owner in errors. A child that cannot be moved or let go
// is killed and reaped.
func startStopped(cmd *exec.Cmd, dir func(c string) string, owner string) error {
	// The tracer is the thread that forked the child: ptrace calls must
	// come from it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	defer func() { cmd.SysProcAttr.Ptrace = false }()
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	fail := func(err error) error {
		_ = unix.Kill(pid, unix.SIGKILL)
		_ = cmd.Wait()
		return err
	}
	ws, err := waitStop(pid)
	if err != nil {
		return fail(fmt.Errorf("waiting for %s to stop at its start: %w", cmd.Path, err))
	}
	if !ws.Stopped() {
		// Gone before its first instruction (killed meanwhile): cmd.Wait
		// can no longer see how, so say it here.
		_ = cmd.Wait()
		return fmt.Errorf("%s ended before it started (wait status %#x)", cmd.Path, uint32(ws))
	}
	// A signal other than the exec's SIGTRAP is passed on when it goes.
	sig := 0
	if s := ws.StopSignal(); s != unix.SIGTRAP {
		sig = int(s)
	}
	proc := []byte(strconv.Itoa(pid))
	for _, c := range v1Controllers {
		if err := os.WriteFile(filepath.Join(dir(c), "cgroup.procs"), proc, 0); err != nil {
			return fail(fmt.Errorf("moving %s into the %s cgroup of %s: %w", cmd.Path, c, owner, err))
		}
	}
	if err := unix.PtraceDetach(pid); err != nil {
		return fail(fmt.Errorf("letting %s go once in the cgroups of %s: %w", cmd.Path, owner, err))
	}
	if sig != 0 {
		_ = unix.Kill(pid, unix.Signal(sig))
	}
	return nil
}

// waitStop waits for the traced child pid to stop (or end), and says how.
func waitStop(pid int) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if !errors.Is(err, unix.EINTR) {
			return ws, err
		}
	}
}

// Usage is what an instance's cgroup has used.
type Usage struct {
	// MemoryBytes counts what is in swap too, where the kernel accounts it.
	MemoryBytes int64
	Pids        int64
	// CPUSeconds is CPU time used since the cgroup was made.
	CPUSeconds float64
	// OOMKills counts processes the memory limit killed; PidsMax counts
	// forks the pids limit refused.
	OOMKills int64
	PidsMax  int64
}

// Usage reads instance name's usage, through its files kept open when it
// can (usageFiles).
func (m *Manager) Usage(name string) (Usage, error) {
	dir := func(c string) string { return m.Dir(c, name) }
	var f *openFiles
	if m.usage != nil {
		f = m.usage.take(name)
	}
	if f == nil {
		return readUsage(m.V2, m.swap, m.tcp, dir)
	}
	u, byPath, err := f.readAll(m.V2, m.swap, m.tcp, dir)
	switch {
	case err == nil:
		return u, nil
	case byPath:
		// No cgroup (a stopped instance): said as a read by path says it.
		m.usage.dropIf(name, f)
		return Usage{}, err
	default:
		// Gone, or made again by someone else: the files by path say.
		m.usage.dropIf(name, f)
		return readUsage(m.V2, m.swap, m.tcp, dir)
	}
}

// ProcessUsage reads the usage of the cgroup process pid is in, as procDir
// (normally /proc) shows it; top, when not nil, maps each cgroup path to
// the one that holds the instance's limits (a container's init may sit in
// a child cgroup of its own). The cgroup's name (its last path element,
// after top) must be one of names: a runtime's pid of an instance whose
// init has ended may name another process since, in another cgroup (an
// agent ends its own init at will), whose usage is never the instance's.
func ProcessUsage(procDir string, pid int, top func(path string) string, names ...string) (Usage, error) {
	v2, dir, err := processCgroups(procDir, pid, top)
	if err != nil {
		return Usage{}, err
	}
	if base := filepath.Base(dir("memory")); !slices.Contains(names, base) {
		return Usage{}, fmt.Errorf("process %d is in cgroup %q, not the instance's (%s): its init has ended", pid, base, strings.Join(names, " or "))
	}
	return readUsage(v2, swapAccounted(v2, dir("memory")), tcpLimited(v2, dir("memory")), dir)
}

// LimitProcessTCP gives the v1 memory cgroup process pid is in (top as
// for ProcessUsage) a TCP buffer limit of bytes, -1 for none, for a
// runtime whose containers' cgroups get none from it (runc ignores the
// OCI spec's kernelTCP). It does nothing where the cgroup has no such
// limit (cgroup v2 charges sockets to the memory limit).
func LimitProcessTCP(procDir string, pid int, top func(path string) string, bytes int64) error {
	v2, dir, err := processCgroups(procDir, pid, top)
	if err != nil || !tcpLimited(v2, dir("memory")) {
		return err
	}
	return os.WriteFile(filepath.Join(dir("memory"), tcpLimitFile), []byte(strconv.FormatInt(bytes, 10)), 0)
}

// LimitTCPIn gives the cgroup v1 memory cgroup dir a TCP buffer limit of
// bytes (-1: none), as LimitProcessTCP does, for a cgroup the caller
// knows by its place; false when dir is no memory cgroup with such a
// limit (cgroup v2, which charges sockets to the memory limit, or no
// cgroup there).
func LimitTCPIn(dir string, bytes int64) (bool, error) {
	if !tcpLimited(false, dir) {
		return false, nil
	}
	return true, os.WriteFile(filepath.Join(dir, tcpLimitFile), []byte(strconv.FormatInt(bytes, 10)), 0)
}

// V2 says whether this host's cgroups are the unified hierarchy.
func V2() bool {
	_, err := os.Stat(filepath.Join(Mount, "cgroup.controllers"))
	return err == nil
}

// processCgroups reads the cgroups of process pid (as ProcessUsage) and
// says whether they are v2, and the directory of each controller.
func processCgroups(procDir string, pid int, top func(path string) string) (bool, func(c string) string, error) {
	f, err := os.Open(filepath.Join(procDir, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return false, nil, err
	}
	defer f.Close()
	paths := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := parts[2]
		if top != nil {
			p = top(p)
		}
		if parts[1] == "" {
			paths[""] = p
		}
		for _, c := range strings.Split(parts[1], ",") {
			paths[c] = p
		}
	}
	if err := s.Err(); err != nil {
		return false, nil, err
	}
	_, statErr := os.Stat(filepath.Join(Mount, "cgroup.controllers"))
	v2 := statErr == nil
	return v2, func(c string) string {
		if v2 {
			return filepath.Join(Mount, paths[""])
		}
		return filepath.Join(Mount, c, paths[c])
	}, nil
}

// readFile reads a cgroup interface file, which holds a few lines at
// most. os.ReadFile takes twice as long on these files (BenchmarkUsage): it asks the
// runtime's poller to take the descriptor (which a file refuses), stats
// the file for a size a cgroup file does not report, and sets up an
// os.File; reading every instance's usage, every pass and every health
// interval, is five such files an instance. The path is the controller's
// own (a cgroup it made below its parent), so it is opened as it is.
func readFile(path string) (string, error) {
	var small [1024]byte
	b, err := fdfile.Read(path, small[:0], maxInterfaceFile, true)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// maxInterfaceFile bounds what readFile takes of a cgroup interface file
// (a few lines).
const maxInterfaceFile = 1 << 20

// readUsage reads a cgroup's usage; dir names its directory of each v1
// controller (any on v2). swap says the kernel accounts swap there
// (swapAccounted): the memory used then counts what is swapped, which
// the memory limit forbids but a cgroup made before it did may hold.
// tcp says a v1 cgroup has a TCP buffer limit (tcpLimited): the memory
// used then counts its TCP buffers, which v1 counts apart.
func readUsage(v2, swap, tcp bool, dir func(c string) string) (Usage, error) {
	return readUsageWith(v2, swap, tcp, dir, readFile)
}

// readUsageWith is readUsage reading each file with readFile (a benchmark
// gives another reader as its baseline).
func readUsageWith(v2, swap, tcp bool, dir func(c string) string, readFile func(string) (string, error)) (Usage, error) {
	var u Usage
	var err error
	read := func(c, file string) int64 {
		if err != nil {
			return 0
		}
		var b string
		b, err = readFile(filepath.Join(dir(c), file))
		if err != nil {
			return 0
		}
		n, perr := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
		if perr != nil {
			err = fmt.Errorf("reading %s of %s: %w", file, dir(c), perr)
		}
		return n
	}
	field := func(c, file, key string) int64 {
		if err != nil {
			return 0
		}
		var b string
		b, err = readFile(filepath.Join(dir(c), file))
		for _, line := range strings.Split(b, "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
		return 0
	}
	if v2 {
		u.MemoryBytes = read("", "memory.current")
		if swap {
			u.MemoryBytes += read("", swapUsageFile(true))
		}
		u.Pids = read("", "pids.current")
		u.CPUSeconds = float64(field("", "cpu.stat", "usage_usec")) / 1e6
		u.OOMKills = field("", "memory.events", "oom_kill")
		u.PidsMax = field("", "pids.events", "max")
		return u, err
	}
	if swap {
		u.MemoryBytes = read("memory", swapUsageFile(false))
	} else {
		u.MemoryBytes = read("memory", "memory.usage_in_bytes")
	}
	if tcp {
		u.MemoryBytes += read("memory", "memory.kmem.tcp.usage_in_bytes")
	}
	u.Pids = read("pids", "pids.current")
	u.OOMKills = field("memory", "memory.oom_control", "oom_kill")
	u.PidsMax = field("pids", "pids.events", "max")
	u.CPUSeconds = float64(read("cpuacct", "cpuacct.usage")) / 1e9
	return u, err
}

// Remove kills what is left in instance name's cgroup and removes it, and
// the parent too when no other instance has a cgroup there, so that the
// host keeps no empty cgroups of ours.
func (m *Manager) Remove(name string) error {
	m.forgetUsageFiles(name)
	var errs []error
	for c := range m.dirs {
		dir := filepath.Join(m.dirs[c], name)
		killAll(dir)
		if err := rmdirRetry(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if !m.kubelets {
			_ = unix.Rmdir(m.dirs[c]) // busy while another instance has one
		}
	}
	return errors.Join(errs...)
}

// forgetUsageFiles closes instance name's usage files, if it keeps any
// open.
func (m *Manager) forgetUsageFiles(name string) {
	if m.usage != nil {
		m.usage.drop(name)
	}
}

// RemoveAll removes every instance's cgroup (their processes killed) and
// the parent, for an administrator retiring a node or a benchmark that
// stopped its controller: a stopped controller keeps its instances'
// cgroups for the next one to adopt.
func (m *Manager) RemoveAll() error {
	var names []string
	seen := map[string]bool{}
	for c := range m.dirs {
		entries, err := os.ReadDir(m.dirs[c])
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				names = append(names, e.Name())
			}
		}
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, m.Remove(n))
	}
	return errors.Join(errs...)
}

// killAll sends SIGKILL to every process listed in dir.
func killAll(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

func rmdirRetry(dir string) error {
	var err error
	for range 50 {
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		killAll(dir)
		_ = unix.Nanosleep(&unix.Timespec{Nsec: 20_000_000}, nil)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}

// RemoveUnused removes the parent named name below this process's own
// cgroups (as New would make it) and the instance cgroups in it, where no
// process is left: the cgroups of a driver whose state directory is gone.
// It creates nothing, kills nothing, and leaves a cgroup that still holds
// a process (rmdir refuses it).
func RemoveUnused(name string) error {
	parents, err := ParentDirs(name)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range parents {
		entries, err := os.ReadDir(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			if e.IsDir() {
				errs = append(errs, rmdirUnused(filepath.Join(p, e.Name())))
			}
		}
		errs = append(errs, rmdirUnused(p))
	}
	return errors.Join(errs...)
}

// ParentDirs are the directories New(name, "") makes, or would make,
// below this process's own cgroups: one a hierarchy on v1, one on v2;
// none on a host without cgroups.
func ParentDirs(name string) ([]string, error) {
	v2, err := unified()
	if errors.Is(err, ErrUnavailable) {
		return nil, nil
	}
	own, err := ownCgroups()
	if errors.Is(err, ErrUnavailable) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading this process's cgroups: %w", err)
	}
	if v2 {
		return []string{filepath.Join(Mount, own[""], name)}, nil
	}
	var dirs []string
	for _, c := range v1Controllers {
		dirs = append(dirs, filepath.Join(Mount, c, own[c], name))
	}
	return dirs, nil
}

// rmdirUnused removes an empty cgroup; one that is gone, still holds a
// process or a child, or is not this user's to remove is not an error.
func rmdirUnused(dir string) error {
	err := unix.Rmdir(dir)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENOTEMPTY) ||
		errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return nil
	}
	return fmt.Errorf("removing the unused cgroup %s: %w", dir, err)
}
