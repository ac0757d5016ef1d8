package startns

import (
	"os"
	"strconv"
)

// bwrapOperands is how many operands each option the bwrap driver and
// host git's jail give bubblewrap takes.
var bwrapOperands = map[string]int{
	"--unshare-all": 0, "--die-with-parent": 0, "--new-session": 0, "--share-net": 0, "--clearenv": 0,
	"--cap-drop": 1, "--proc": 1, "--dev": 1, "--tmpfs": 1, "--size": 1, "--remount-ro": 1, "--chdir": 1, "--info-fd": 1,
	"--symlink": 2, "--setenv": 2, "--bind-fd": 2, "--ro-bind-fd": 2,
	"--bind": 2, "--bind-try": 2, "--ro-bind": 2, "--ro-bind-try": 2, "--dev-bind": 2, "--dev-bind-try": 2,
}

// bwrapSources are the options whose first operand is a host path
// bubblewrap binds (with every mount below it).
var bwrapSources = map[string]bool{
	"--bind": true, "--bind-try": true, "--ro-bind": true, "--ro-bind-try": true, "--dev-bind": true, "--dev-bind-try": true,
}

// bwrapFdSources are the options whose first operand is a descriptor
// bubblewrap binds: it binds the path the descriptor names (its link in
// /proc/self/fd), which must be there at the start too.
var bwrapFdSources = map[string]bool{"--bind-fd": true, "--ro-bind-fd": true}

// ForBubblewrap is what a start of bubblewrap with args (its options, up
// to "--" and the command) needs from the host's mounts: its bind
// sources, the paths of the descriptors it binds (files are those it
// inherits, from descriptor 3 on), and the binaries the start runs
// (bubblewrap, a cgroup starter). nil, all of the host's mounts, when
// args hold an option this does not know (its operands might be
// sources) or a descriptor that is not among files.
func ForBubblewrap(args []string, files []*os.File, binaries ...string) *Host {
	h := &Host{}
	for i := 0; i < len(args) && args[i] != "--"; {
		n, ok := bwrapOperands[args[i]]
		if !ok || i+n >= len(args) {
			return nil
		}
		switch {
		case bwrapSources[args[i]]:
			h.Binds = append(h.Binds, args[i+1])
		case bwrapFdSources[args[i]]:
			fd, err := strconv.Atoi(args[i+1])
			if err != nil || fd < 3 || fd-3 >= len(files) {
				return nil
			}
			p, err := os.Readlink("/proc/self/fd/" + strconv.FormatUint(uint64(files[fd-3].Fd()), 10))
			if err != nil {
				return nil
			}
			h.Binds = append(h.Binds, p)
		}
		i += 1 + n
	}
	for _, b := range binaries {
		if b != "" {
			h.Paths = append(h.Paths, b)
		}
	}
	return h
}
