package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/commandname"
)

func TestCheckArgv(t *testing.T) {
	allowed := []string{"git", "python3"}
	cases := []struct {
		name    string
		argv    []string
		wantErr string
	}{
		{"allowed command runs", []string{"git", "status"}, ""},
		{"arguments may hold anything", []string{"git", "commit", "-m", "a; rm -rf / && $(x) `y` | z"}, ""},
		{"empty argv", nil, "no command given"},
		{"empty command", []string{""}, "no command given"},
		{"not allowlisted", []string{"curl"}, "not in the sandbox's binaries allowlist"},
		{"path is refused", []string{"/usr/bin/git"}, commandname.MsgSlash},
		{"relative path is refused", []string{"./git"}, commandname.MsgSlash},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckArgv(allowed, c.argv)
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckArgv(%q) = %v, want nil", c.argv, err)
				}
				return
			}
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("CheckArgv(%q) = %v, want ErrRefused mentioning %q", c.argv, err, c.wantErr)
			}
		})
	}
}

// TestCheckArgvRejectsEveryMetacharacter runs each shell metacharacter and
// each whitespace character, alone and inside an allowed name, and wants the
// refusal to name the character.
func TestCheckArgvRejectsEveryMetacharacter(t *testing.T) {
	chars := []rune(commandname.ShellMetacharacters + " \t\n\r\v\f")
	if len(chars) < 26 {
		t.Fatalf("only %d forbidden characters, the table shrank", len(chars))
	}
	for _, r := range chars {
		for _, cmd := range []string{"git" + string(r), string(r) + "git", "gi" + string(r) + "t"} {
			t.Run(fmt.Sprintf("metacharacter/%q/in/%q", r, cmd), func(t *testing.T) {
				allowed := []string{"git", cmd}
				err := CheckArgv(allowed, []string{cmd, "arg"})
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("CheckArgv(%q) = %v, want a refusal even though the name is listed", cmd, err)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("%q", r)) {
					t.Fatalf("refusal %q does not name the character %q", err, r)
				}
				want := "shell metacharacter"
				if isSpace(r) {
					want = "whitespace"
				}
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("refusal %q does not say %q", err, want)
				}
			})
		}
	}
}

func lookupFrom(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestBuildEnv(t *testing.T) {
	runtimeEnv := map[string]string{
		"SECRET_TOKEN":  "must-not-leak",
		"LD_PRELOAD":    "/evil.so",
		"USER":          "root",
		"SSH_AUTH_SOCK": "/run/ssh.sock",
		"EDITOR":        "vi",
	}
	cases := []struct {
		name    string
		src     EnvSources
		runtime map[string]string
		want    []string
		wantErr string
	}{
		{
			name:    "nothing configured: only PATH, HOME and the default locale",
			runtime: runtimeEnv,
			want:    []string{"HOME=/workspace", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PATH=" + MinimalPath},
		},
		{
			name:    "runtime LANG is kept and LC_ALL is not forced over it",
			runtime: map[string]string{"LANG": "de_DE.UTF-8"},
			want:    []string{"HOME=/workspace", "LANG=de_DE.UTF-8", "PATH=" + MinimalPath},
		},
		{
			name:    "runtime LC_ALL is kept",
			runtime: map[string]string{"LC_ALL": "fr_FR.UTF-8"},
			want:    []string{"HOME=/workspace", "LANG=C.UTF-8", "LC_ALL=fr_FR.UTF-8", "PATH=" + MinimalPath},
		},
		{
			name:    "dotenv and passthrough reach the command, nothing else",
			src:     EnvSources{Passthrough: []string{"SSH_AUTH_SOCK", "NOT_SET_ANYWHERE"}, DotEnv: []byte("FOO=bar\nexport BAZ='q u x'\n")},
			runtime: runtimeEnv,
			want:    []string{"BAZ=q u x", "FOO=bar", "HOME=/workspace", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PATH=" + MinimalPath, "SSH_AUTH_SOCK=/run/ssh.sock"},
		},
		{
			name:    "passthrough wins over dotenv",
			src:     EnvSources{Passthrough: []string{"EDITOR"}, DotEnv: []byte("EDITOR=nano\n")},
			runtime: runtimeEnv,
			want:    []string{"EDITOR=vi", "HOME=/workspace", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PATH=" + MinimalPath},
		},
		{
			name:    "dotenv may set the locale",
			src:     EnvSources{DotEnv: []byte("LANG=en_GB.UTF-8\n")},
			runtime: map[string]string{},
			want:    []string{"HOME=/workspace", "LANG=en_GB.UTF-8", "LC_ALL=C.UTF-8", "PATH=" + MinimalPath},
		},
		{
			name: "home override for the unsandboxed path",
			src:  EnvSources{Home: "/srv/agents/a/workspace"},
			want: []string{"HOME=/srv/agents/a/workspace", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PATH=" + MinimalPath},
		},
		{
			name:    "passthrough of PATH is refused",
			src:     EnvSources{Passthrough: []string{"PATH"}},
			runtime: map[string]string{"PATH": "/home/u/bin"},
			wantErr: "passthrough variable PATH is set by the sandbox",
		},
		{
			name:    "malformed dotenv fails the build",
			src:     EnvSources{DotEnv: []byte("A=1\nnot an assignment\n")},
			wantErr: "line 2",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.src.Lookup = lookupFrom(c.runtime)
			got, err := BuildEnv(c.src)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("BuildEnv = %v, %v; want error mentioning %q", got, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("BuildEnv: %v", err)
			}
			// GitConfig is in every environment.
			want := slices.Sorted(slices.Values(append(slices.Clone(c.want), GitConfig...)))
			if !slices.Equal(got, want) {
				t.Fatalf("BuildEnv =\n  %q\nwant\n  %q", got, want)
			}
		})
	}
}

func TestParseDotEnv(t *testing.T) {
	good := strings.Join([]string{
		"# a comment",
		"",
		"PLAIN=value",
		"SPACED = spaced value  ",
		"export EXPORTED=yes",
		"EMPTY=",
		"SINGLE='literal $HOME \\n'",
		`DOUBLE="tab\there \"q\" back\\slash"`,
		"COMMENTED=value # trailing comment",
		"HASH=a#b",
		"QUOTED_COMMENT='x' # fine",
		"  INDENTED=1",
		"CRLF=v\r",
		"exporter=also a name",
	}, "\n")
	vars, err := ParseDotEnv(strings.NewReader(good))
	if err != nil {
		t.Fatalf("ParseDotEnv: %v", err)
	}
	want := []DotEnvVar{
		{"PLAIN", "value", 3}, {"SPACED", "spaced value", 4}, {"EXPORTED", "yes", 5},
		{"EMPTY", "", 6}, {"SINGLE", `literal $HOME \n`, 7}, {"DOUBLE", "tab\there \"q\" back\\slash", 8},
		{"COMMENTED", "value", 9}, {"HASH", "a#b", 10}, {"QUOTED_COMMENT", "x", 11},
		{"INDENTED", "1", 12}, {"CRLF", "v", 13}, {"exporter", "also a name", 14},
	}
	if !slices.Equal(vars, want) {
		t.Fatalf("ParseDotEnv =\n  %+v\nwant\n  %+v", vars, want)
	}

	bad := []struct {
		name, input, want string
	}{
		{"no equals sign", "A=1\nB=2\njust words\n", "line 3: expected NAME=value"},
		{"name with a dash", "MY-VAR=1", "line 1: \"MY-VAR\" is not a variable name"},
		{"name starting with a digit", "\n\n1A=1", "line 3: \"1A\" is not a variable name"},
		{"empty name", "=1", "line 1: \"\" is not a variable name"},
		{"unterminated single quote", "A='x", "line 1: value of A: unterminated single quote"},
		{"unterminated double quote", "A=\"x\\\"", "line 1: value of A: unterminated double quote"},
		{"junk after quote", "A='x' y", "line 1: value of A: unexpected \"y\" after the closing quote"},
		{"unknown escape", `A="\q"`, `line 1: value of A: unknown escape \q`},
		{"HOME is fixed", "# c\nHOME=/root", "line 2: HOME is set by the sandbox"},
		{"PATH is fixed", "PATH=/tmp", "line 1: PATH is set by the sandbox"},
		{"NUL byte", "A=x\x00y", "line 1: value of A contains a NUL byte"},
		{"the loader's preload", "LD_PRELOAD=/workspace/x.so", "line 1: LD_PRELOAD has the loader load code into every command"},
		{"any loader variable", "A=1\nexport LD_LIBRARY_PATH=/workspace", "line 2: LD_LIBRARY_PATH has the loader"},
		{"iconv's modules", "GCONV_PATH=/workspace", "line 1: GCONV_PATH has the loader"},
		{"getconf's programs", "GETCONF_DIR=/workspace", "line 1: GETCONF_DIR has the loader"},
	}
	for _, c := range bad {
		t.Run("malformed/"+c.name, func(t *testing.T) {
			_, err := ParseDotEnv(strings.NewReader(c.input))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParseDotEnv(%q) = %v, want an error containing %q", c.input, err, c.want)
			}
		})
	}
}

func TestSandboxDisabled(t *testing.T) {
	cases := []struct {
		value    string
		disabled bool
	}{
		{"i-am-in-a-container", true},
		{"babe-i-brought-protection", true},
		{"we-are-literally-transbians-what", true},
		{"", false},
		{"1", false},
		{"true", false},
		{"yes", false},
		{"I-AM-IN-A-CONTAINER", false},
		{"I-am-in-a-container", false},
		{" i-am-in-a-container", false},
		{"i-am-in-a-container ", false},
		{"i-am-in-a-container\n", false},
		{"\ti-am-in-a-container", false},
		{"i_am_in_a_container", false},
		{"i-am-in-a-container,babe-i-brought-protection", false},
		{"Babe-I-Brought-Protection", false},
		{"we-are-literally-transbians", false},
		{"we-are-literally-transbians-what?", false},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("disable/%q", c.value), func(t *testing.T) {
			getenv := func(k string) string {
				if k == DisableSandboxEnv {
					return c.value
				}
				return ""
			}
			v, disabled := SandboxDisabled(getenv)
			if disabled != c.disabled || v != c.value {
				t.Fatalf("SandboxDisabled with %q = (%q, %v), want (%q, %v)", c.value, v, disabled, c.value, c.disabled)
			}
		})
	}
	if w := DisabledWarning("i-am-in-a-container", 0, 0); !strings.Contains(w, "SANDBOX IS DISABLED") || !strings.Contains(w, DisableSandboxEnv) || !strings.Contains(w, "uid 0, gid 0") {
		t.Fatalf("warning %q is not loud enough", w)
	}
}

func TestReadDotEnv(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(dir, "workspace")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Run("missing file is no values", func(t *testing.T) {
		b, err := ReadDotEnv(areas.HostDir{Path: ws}, areas.Identity{})
		if err != nil || b != nil {
			t.Fatalf("ReadDotEnv = %q, %v; want nil, nil", b, err)
		}
	})
	t.Run("regular file is read", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(ws, ".env"), []byte("A=1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := ReadDotEnv(areas.HostDir{Path: ws}, areas.Identity{})
		if err != nil || string(b) != "A=1\n" {
			t.Fatalf("ReadDotEnv = %q, %v", b, err)
		}
	})
	t.Run("link inside the workspace is followed", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(ws, "real.env"), []byte("B=2\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(ws, ".env"))
		if err := os.Symlink("real.env", filepath.Join(ws, ".env")); err != nil {
			t.Fatal(err)
		}
		b, err := ReadDotEnv(areas.HostDir{Path: ws}, areas.Identity{})
		if err != nil || string(b) != "B=2\n" {
			t.Fatalf("ReadDotEnv = %q, %v", b, err)
		}
	})
	t.Run("link leaving the workspace is refused", func(t *testing.T) {
		secret := filepath.Join(dir, "secret")
		if err := os.WriteFile(secret, []byte("SECRET=host\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, target := range []string{secret, "../secret"} {
			os.Remove(filepath.Join(ws, ".env"))
			if err := os.Symlink(target, filepath.Join(ws, ".env")); err != nil {
				t.Fatal(err)
			}
			b, err := ReadDotEnv(areas.HostDir{Path: ws}, areas.Identity{})
			if !errors.Is(err, areas.ErrEscape) {
				t.Fatalf("ReadDotEnv through a link to %s = %q, %v; want an escape refusal", target, b, err)
			}
		}
	})
}
