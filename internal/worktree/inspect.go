package worktree

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
)

// Reasons of a worktree that could not be added or checked; they are
// condition reasons, as are the health reasons.
const (
	// ReasonUnsafeRepository: the repository's git directory holds
	// something host git must not be let near (a link, a FIFO, an
	// oversized file, a filter driver, a configuration include).
	ReasonUnsafeRepository = "UnsafeRepository"
	// ReasonGitFailed: host git exited with an error.
	ReasonGitFailed = "GitFailed"
	// ReasonGitTimedOut: host git did not finish within its deadline.
	ReasonGitTimedOut = "GitTimedOut"
	// ReasonGitJailFailed: the jail host git runs in could not be set up,
	// most often because the agent's identity cannot reach the mount's
	// host directory; git itself never ran.
	ReasonGitJailFailed = "GitJailFailed"
)

// Error is a failure with a condition reason and a message in the
// product's words: never git's own output, which may echo what it read.
type Error struct {
	Reason  string
	Message string
}

func (e *Error) Error() string { return e.Message }

// ReasonOf is the condition reason err carries, or "" when it carries none.
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

func unsafeRepo(format string, args ...any) error {
	return &Error{Reason: ReasonUnsafeRepository, Message: fmt.Sprintf(format, args...)}
}

// Size limits of the git files the controller reads itself. They are
// written by the agent, so each read stops at its limit (the controller's
// memory per read is at most the limit) and a larger file is an error.
const (
	// MaxLinkFileSize bounds a worktree's .git file and the small files of
	// its administrative directory (gitdir, commondir, HEAD, locked): each
	// holds one path or one ref.
	MaxLinkFileSize = 4 << 10
	// MaxConfigSize bounds .git/config, config.worktree and info/exclude,
	// which the controller reads to refuse filter drivers and to add the
	// worktrees directory to the exclusions.
	MaxConfigSize = 64 << 10
)

// ErrTooLarge is returned (wrapped) for a file over its read limit.
var ErrTooLarge = errors.New("file is larger than the controller reads")

// readBounded reads a regular file beneath the mount, refusing links and
// anything but a regular file (a FIFO would block), and at most limit
// bytes: a larger file is an error, not a prefix.
func readBounded(root *areas.Root, rel string, limit int64) ([]byte, error) {
	fi, err := root.Lstat(rel)
	if err != nil {
		return nil, err
	}
	if fi.Type != areas.TypeFile {
		return nil, fmt.Errorf("reading %s: it is a %s, not a regular file", rel, fi.Type)
	}
	f, err := root.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", rel, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("reading %s: %w (limit %d bytes)", rel, ErrTooLarge, limit)
	}
	return b, nil
}

// gitFiles are the files of a repository's git directory that host git
// reads for the commands the controller runs. Each must be a regular file
// (or absent): a link could have git read a host file as the agent's
// identity and echo it, a FIFO would block it.
var gitFiles = []string{"HEAD", "config", "config.worktree", "packed-refs", "objects/info/alternates", "info/attributes", "info/exclude", "info/sparse-checkout", "shallow"}

// gitDirs are directories on the way to those files; each must be a
// directory, not a link.
var gitDirs = []string{"objects", "objects/info", "info", "refs", "worktrees"}

// checkGitDir refuses a repository whose git directory host git must not
// read: links or special files where git reads, a commondir or gitdir file
// (which would send git to another directory), or configuration that
// declares commands (filter drivers, diff and merge drivers) or includes
// files the controller has not read. It reads only through the mount's
// contained root and only within the limits above. The agent may change
// the directory after this check; the jail and the unprivileged identity
// are what hold then, this check gives a clear reason up front.
func checkGitDir(repo Repo) error {
	gitDir := repo.rel(".git")
	for _, d := range gitDirs {
		fi, err := repo.Mount.Lstat(path.Join(gitDir, d))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return unsafeRepo("checking %s/.git/%s: %v", repo.HostPath(), d, err)
		}
		if fi.Type != areas.TypeDir {
			return unsafeRepo("%s/.git/%s is a %s, not a directory; host git does not follow links or special files out of a repository", repo.HostPath(), d, fi.Type)
		}
	}
	for _, f := range gitFiles {
		if err := mustBeRegular(repo, path.Join(gitDir, f)); err != nil {
			return err
		}
	}
	for _, f := range []string{"commondir", "gitdir"} {
		if _, err := repo.Mount.Lstat(path.Join(gitDir, f)); err == nil {
			return unsafeRepo("%s/.git/%s exists: that is a linked worktree's git directory, not a main repository's; name the main repository", repo.HostPath(), f)
		}
	}
	for _, f := range []string{"config", "config.worktree"} {
		if err := checkConfig(repo, path.Join(gitDir, f)); err != nil {
			return err
		}
	}
	// git worktree add reads every worktree's HEAD (a branch may be checked
	// out once only), so one poisoned worktree poisons the repository.
	admins, err := repo.Mount.ListAtMost(path.Join(gitDir, "worktrees"), maxWorktrees)
	if errors.Is(err, areas.ErrTooManyEntries) {
		return unsafeRepo("%s/.git/worktrees has more than %d entries; the controller checks at most %d worktrees of a repository", repo.HostPath(), maxWorktrees, maxWorktrees)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return unsafeRepo("listing %s/.git/worktrees: %v", repo.HostPath(), err)
	}
	for _, a := range admins {
		if a.Type != areas.TypeDir {
			return unsafeRepo("%s/.git/worktrees/%s is a %s, not a directory", repo.HostPath(), quote(a.Name), a.Type)
		}
		if err := checkAdminDir(repo, a.Name); err != nil {
			return err
		}
	}
	return nil
}

// maxWorktrees bounds how many worktrees of one repository the check
// reads before host git runs.
const maxWorktrees = 1024

// maxAdminEntries bounds the entries of a worktree's administrative
// directory the check reads: git keeps about ten there (HEAD, gitdir,
// commondir, index, locked, logs, refs, ...).
const maxAdminEntries = 256

// checkAdminDir refuses a worktree's administrative directory
// (.git/worktrees/<name>) holding anything but regular files and
// directories: git reads HEAD, gitdir, commondir, locked and its index
// there.
func checkAdminDir(repo Repo, name string) error {
	admin := repo.rel(".git", "worktrees", name)
	fi, err := repo.Mount.Lstat(admin)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return unsafeRepo("checking %s/.git/worktrees/%s: %v", repo.HostPath(), quote(name), err)
	}
	if fi.Type != areas.TypeDir {
		return unsafeRepo("%s/.git/worktrees/%s is a %s, not a directory", repo.HostPath(), quote(name), fi.Type)
	}
	entries, err := repo.Mount.ListAtMost(admin, maxAdminEntries)
	if errors.Is(err, areas.ErrTooManyEntries) {
		return unsafeRepo("%s/.git/worktrees/%s has more than %d entries; git keeps a handful there", repo.HostPath(), quote(name), maxAdminEntries)
	}
	if err != nil {
		return unsafeRepo("listing %s/.git/worktrees/%s: %v", repo.HostPath(), quote(name), err)
	}
	for _, e := range entries {
		if e.Type != areas.TypeFile && e.Type != areas.TypeDir {
			return unsafeRepo("%s/.git/worktrees/%s/%s is a %s; host git reads only regular files there", repo.HostPath(), quote(name), quote(e.Name), e.Type)
		}
	}
	return checkConfig(repo, path.Join(admin, "config.worktree"))
}

func mustBeRegular(repo Repo, rel string) error {
	fi, err := repo.Mount.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return unsafeRepo("checking %s: %v", shown(repo, rel), err)
	}
	if fi.Type != areas.TypeFile {
		return unsafeRepo("%s is a %s, not a regular file; host git does not read links or special files out of a repository", shown(repo, rel), fi.Type)
	}
	return nil
}

// shown is rel as a message shows it: quoted, since a directory on its
// way may be one the agent named.
func shown(repo Repo, rel string) string {
	return strconv.Quote(path.Join(repo.Mount.HostPath(), rel))
}

// checkConfig refuses a git configuration file that declares a command
// host git could be made to run or that pulls in other files: filter
// drivers (smudge, clean, process), diff drivers (command, textconv), merge
// drivers (driver) and include/includeIf sections. It reads generously:
// any line that may be such a key counts, so a quoting trick cannot hide
// one from this check that git would still see.
func checkConfig(repo Repo, rel string) error {
	b, err := readBounded(repo.Mount, rel, MaxConfigSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return unsafeRepo("reading %s: %v", shown(repo, rel), err)
	}
	if key := commandKey(b); key != "" {
		return unsafeRepo("%s declares %s; the controller does not add worktrees to repositories whose configuration runs commands or includes other files", shown(repo, rel), key)
	}
	return nil
}

// commandKey returns the first key of a git configuration that names a
// command or an include, or "".
func commandKey(conf []byte) string {
	conf = bytes.TrimPrefix(conf, []byte("\xef\xbb\xbf"))
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(conf))
	sc.Buffer(make([]byte, 0, 4096), MaxConfigSize+1)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			name, rest, ok := sectionHeader(line)
			if !ok {
				// git refuses such a file too; refusing here keeps this
				// reader from having to agree with git on broken input.
				return "a malformed section header"
			}
			section = name
			if section == "include" || section == "includeif" {
				return strconv.Quote(section) + " (a configuration include)"
			}
			// git allows a key on the header's line.
			line = strings.TrimSpace(rest)
		}
		// A key is letters, digits and '-'; whatever follows (a value, a
		// comment) does not matter here.
		key := strings.ToLower(line[:len(line)-len(strings.TrimLeftFunc(line, isKeyRune))])
		switch {
		case section == "filter" && (key == "smudge" || key == "clean" || key == "process"):
		case section == "diff" && (key == "command" || key == "textconv" || key == "external"):
		case section == "merge" && key == "driver":
		default:
			continue
		}
		return section + ".<driver>." + key
	}
	return ""
}

// sectionHeader reads a "[section]", "[section.sub]" or
// `[section "sub"]` header the way git does, and returns the section's
// lowercased name (without its subsection) and what follows the header.
func sectionHeader(line string) (name, rest string, ok bool) {
	i := 1
	for i < len(line) && (isKeyRune(rune(line[i])) || line[i] == '.') {
		i++
	}
	name, _, _ = strings.Cut(strings.ToLower(line[1:i]), ".")
	if i < len(line) && line[i] == ']' {
		return name, line[i+1:], name != ""
	}
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	if i == len(line) || line[i] != '"' || strings.Contains(line[1:i], ".") {
		return "", "", false
	}
	for i++; i < len(line) && line[i] != '"'; i++ {
		if line[i] == '\\' {
			i++
		}
	}
	if i+1 >= len(line) || line[i+1] != ']' {
		return "", "", false
	}
	return name, line[i+2:], name != ""
}

func isKeyRune(r rune) bool {
	return r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}
