package policy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/pattern"
)

// MinimalPath is the PATH every command gets: the system directories only.
const MinimalPath = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

// SandboxHome is HOME and the working directory inside the sandbox.
const SandboxHome = "/workspace"

// DefaultLocale is LANG (and LC_ALL) when the runtime's environment sets no
// locale of its own.
const DefaultLocale = "C.UTF-8"

// DotEnvFile is the file in the workspace whose values every command gets.
const DotEnvFile = ".env"

// GitConfig is git configuration every command runs with, as GIT_CONFIG_*
// variables that override .env and passthrough: session worktrees'
// back-pointers name host paths the sandbox does not mount, so gc inside
// must never prune worktrees, and the repositories belong to the host user
// rather than the sandbox's identity.
var GitConfig = []string{
	"GIT_CONFIG_COUNT=2",
	"GIT_CONFIG_KEY_0=gc.worktreePruneExpire", "GIT_CONFIG_VALUE_0=never",
	"GIT_CONFIG_KEY_1=safe.directory", "GIT_CONFIG_VALUE_1=*",
}

// fixedVars are set by the policy alone: a .env line or a passthrough entry
// naming one is an error rather than a silent override, so that "HOME is
// the workspace" and "PATH is minimal" hold for every command.
var fixedVars = []string{"HOME", "PATH"}

var envName = pattern.Lazy(`^[A-Za-z_][A-Za-z0-9_]*$`)

// loaderVar says whether name is read by the dynamic loader or the C
// library to load code into any program: LD_PRELOAD, LD_AUDIT,
// LD_LIBRARY_PATH and every LD_ variable, GCONV_PATH (iconv's modules),
// GETCONF_DIR (the programs getconf runs). From .env, which the agent
// writes, one would run the agent's own code in every allowlisted
// command, cat and ls as much as a shell: the allowlist would allow
// anything. The operator may still pass one through.
func loaderVar(name string) bool {
	return strings.HasPrefix(name, "LD_") || name == "GCONV_PATH" || name == "GETCONF_DIR"
}

// EnvSources are everything a command's environment is built from.
type EnvSources struct {
	// Passthrough names variables copied from the runtime's own
	// environment; a name the runtime does not set is left out.
	Passthrough []string
	// Lookup reads the runtime's own environment (os.LookupEnv). Nil means
	// an empty environment.
	Lookup func(string) (string, bool)
	// DotEnv is the content of workspace/.env; nil when there is none.
	DotEnv []byte
	// Home is HOME; empty means SandboxHome. Only the unsandboxed path sets
	// it, because /workspace does not exist on the host.
	Home string
	// Proxy, when set, is the URL of the Sandbox's egress proxy: the
	// proxy variables (ProxyVars) point at it, and NO_PROXY keeps
	// loopback direct. They override .env and passthrough: the proxy is
	// the only way out, so pointing a tool elsewhere only breaks it.
	Proxy string
}

// ProxyVars are the variables tools read their proxy from, in both the
// upper-case and the lower-case spelling (curl reads only http_proxy).
var ProxyVars = []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"}

// NoProxy is NO_PROXY with a proxy: loopback stays direct.
const NoProxy = "localhost,127.0.0.1,::1"

// BuildEnv builds a command's environment from nothing, in this order, later
// sources winning: LANG and LC_ALL (from the runtime, else C.UTF-8), the
// values of workspace/.env, the passthrough variables; then the proxy
// variables (with a Proxy), GitConfig, PATH and HOME, which nothing
// overrides. The result is sorted "NAME=value" entries.
//
// LC_ALL defaults to C.UTF-8 only when the runtime sets neither LANG nor
// LC_ALL, so that a runtime LANG is not silently overridden.
func BuildEnv(src EnvSources) ([]string, error) {
	lookup := src.Lookup
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	env := map[string]string{}
	lang, hasLang := lookup("LANG")
	lcAll, hasLCAll := lookup("LC_ALL")
	switch {
	case hasLang && lang != "":
		env["LANG"] = lang
	default:
		env["LANG"] = DefaultLocale
	}
	switch {
	case hasLCAll && lcAll != "":
		env["LC_ALL"] = lcAll
	case !hasLang || lang == "":
		env["LC_ALL"] = DefaultLocale
	}

	vars, err := ParseDotEnv(bytes.NewReader(src.DotEnv))
	if err != nil {
		return nil, err
	}
	for _, v := range vars {
		env[v.Name] = v.Value
	}

	for _, name := range src.Passthrough {
		if !envName().MatchString(name) {
			return nil, fmt.Errorf("building the command environment: passthrough variable %q: not a variable name", name)
		}
		if slices.Contains(fixedVars, name) {
			return nil, fmt.Errorf("building the command environment: passthrough variable %s is set by the sandbox (PATH is minimal, HOME is the workspace) and cannot be passed through", name)
		}
		if v, ok := lookup(name); ok {
			env[name] = v
		}
	}

	if src.Proxy != "" {
		for _, k := range ProxyVars {
			env[k] = src.Proxy
		}
		env["NO_PROXY"], env["no_proxy"] = NoProxy, NoProxy
	}
	for _, kv := range GitConfig {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	env["PATH"] = MinimalPath
	env["HOME"] = src.Home
	if src.Home == "" {
		env["HOME"] = SandboxHome
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

// DotEnvVar is one assignment of a .env file.
type DotEnvVar struct {
	Name  string
	Value string
	// Line is the 1-based line the assignment is on.
	Line int
}

// ParseDotEnv reads a .env file: one NAME=value a line, optionally preceded
// by "export "; blank lines and lines starting with # are ignored. A value
// is taken literally between single quotes, with \n, \t, \" and \\ escapes
// between double quotes, and unquoted up to a " #" comment with surrounding
// blanks trimmed. Any other line is an error naming its line number: a
// silently skipped line would leave a command without a value its author
// thinks it has.
func ParseDotEnv(r io.Reader) ([]DotEnvVar, error) {
	var out []DotEnvVar
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(strings.TrimSuffix(sc.Text(), "\r"))
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		v, err := parseDotEnvLine(text)
		if err != nil {
			return nil, fmt.Errorf("reading %s: line %d: %w", DotEnvFile, line, err)
		}
		v.Line = line
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: after line %d: %w", DotEnvFile, line, err)
	}
	return out, nil
}

func parseDotEnvLine(text string) (DotEnvVar, error) {
	if rest, ok := strings.CutPrefix(text, "export"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
		text = strings.TrimSpace(rest)
	}
	name, raw, ok := strings.Cut(text, "=")
	if !ok {
		return DotEnvVar{}, errors.New("expected NAME=value")
	}
	name = strings.TrimSpace(name)
	if !envName().MatchString(name) {
		return DotEnvVar{}, fmt.Errorf("%q is not a variable name: letters, digits and '_', not starting with a digit", name)
	}
	if slices.Contains(fixedVars, name) {
		return DotEnvVar{}, fmt.Errorf("%s is set by the sandbox (PATH is minimal, HOME is the workspace) and cannot be set in %s", name, DotEnvFile)
	}
	if loaderVar(name) {
		return DotEnvVar{}, fmt.Errorf("%s has the loader load code into every command, and cannot be set in %s, which the agent writes: the allowlist would allow anything (an operator may pass it through)", name, DotEnvFile)
	}
	value, err := parseDotEnvValue(strings.TrimSpace(raw))
	if err != nil {
		return DotEnvVar{}, fmt.Errorf("value of %s: %w", name, err)
	}
	if strings.IndexByte(value, 0) >= 0 {
		return DotEnvVar{}, fmt.Errorf("value of %s contains a NUL byte", name)
	}
	return DotEnvVar{Name: name, Value: value}, nil
}

func parseDotEnvValue(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	var value, rest string
	switch raw[0] {
	case '\'':
		end := strings.IndexByte(raw[1:], '\'')
		if end < 0 {
			return "", errors.New("unterminated single quote")
		}
		value, rest = raw[1:1+end], raw[2+end:]
	case '"':
		var b strings.Builder
		i := 1
		for ; i < len(raw) && raw[i] != '"'; i++ {
			if raw[i] != '\\' {
				b.WriteByte(raw[i])
				continue
			}
			i++
			if i == len(raw) {
				break
			}
			switch raw[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case '"', '\\':
				b.WriteByte(raw[i])
			default:
				return "", fmt.Errorf("unknown escape \\%c in double quotes (known: \\n \\t \\\" \\\\)", raw[i])
			}
		}
		if i >= len(raw) {
			return "", errors.New("unterminated double quote")
		}
		value, rest = b.String(), raw[i+1:]
	default:
		value = raw
		if i := strings.Index(raw, " #"); i >= 0 {
			value = raw[:i]
		} else if i := strings.Index(raw, "\t#"); i >= 0 {
			value = raw[:i]
		}
		return strings.TrimSpace(value), nil
	}
	rest = strings.TrimSpace(rest)
	if rest != "" && !strings.HasPrefix(rest, "#") {
		return "", fmt.Errorf("unexpected %q after the closing quote", rest)
	}
	return value, nil
}

// MaxDotEnvSize is the largest workspace/.env the runtime reads. The agent
// writes the file and it is read for every command, so a larger one is an
// error (ErrDotEnvTooLarge) rather than a read that grows with it: 64 KiB
// holds hundreds of variables.
const MaxDotEnvSize = 64 << 10

// ErrDotEnvTooLarge is returned (wrapped) for a .env over MaxDotEnvSize.
var ErrDotEnvTooLarge = fmt.Errorf("%s is larger than %d KiB", DotEnvFile, MaxDotEnvSize>>10)

// ReadDotEnv reads workspace/.env through the contained file access, as
// the agent (as), so a symbolic link planted by a command cannot make the
// runtime read a file outside the workspace or one the agent cannot read, and reads at most MaxDotEnvSize bytes of it. A
// missing file is no file: nil, nil.
func ReadDotEnv(workspace areas.HostDir, as areas.Identity) ([]byte, error) {
	root, err := areas.OpenRootAt("workspace", workspace, true)
	if err != nil {
		return nil, fmt.Errorf("reading workspace/%s: %w", DotEnvFile, err)
	}
	root = root.As(as)
	f, err := root.Open(DotEnvFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading workspace/%s: %w", DotEnvFile, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxDotEnvSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading workspace/%s: %w", DotEnvFile, err)
	}
	if len(b) > MaxDotEnvSize {
		return nil, fmt.Errorf("reading workspace/%s: %w; shorten it", DotEnvFile, ErrDotEnvTooLarge)
	}
	return b, nil
}
