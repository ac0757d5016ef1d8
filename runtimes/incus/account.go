package incus

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/cireilclaw/sandbox-controller/internal/policy"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/runtimes/incus/incusapi"
)

// SudoersFile is where the mapped account's passwordless sudo rule goes.
const SudoersFile = "/etc/sudoers.d/cireilclaw"

// accountMark is the KeyAccount value of a root set up for the identity.
func accountMark(id runtimes.Identity) string {
	return fmt.Sprintf("%d:%d", id.UID, id.GID)
}

// setupAccount makes the mapped account exist inside the container: a
// passwd entry (home /workspace), its group, a locked shadow entry, and
// passwordless sudo when the image has sudo (an /etc/sudoers.d
// directory). It acts as root through the file API and never runs a
// command; an image that already has an account with the UID keeps it
// under its own name. Files already right are not written again. Once
// done it marks the instance (KeyAccount), so later starts of the same
// root skip the file API, whose first call after a start is slow.
func setupAccount(ctx context.Context, cl *incusapi.Client, name string, id runtimes.Identity) error {
	user, err := ensureEntry(ctx, cl, name, "/etc/passwd", 2, id.UID, func(n string) string {
		return fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/sh", n, id.UID, id.GID, n, policy.SandboxHome)
	})
	if err != nil {
		return fmt.Errorf("setting up the account of UID %d: %w", id.UID, err)
	}
	if _, err := ensureEntry(ctx, cl, name, "/etc/group", 2, id.GID, func(n string) string {
		return fmt.Sprintf("%s:x:%d:", n, id.GID)
	}); err != nil {
		return fmt.Errorf("setting up the group of GID %d: %w", id.GID, err)
	}
	if err := ensureShadow(ctx, cl, name, user); err != nil {
		return fmt.Errorf("setting up the account of UID %d: %w", id.UID, err)
	}
	if err := ensureSudo(ctx, cl, name, user); err != nil {
		return fmt.Errorf("setting up passwordless sudo for %s: %w", user, err)
	}
	inst, etag, err := cl.GetInstance(ctx, name)
	if err != nil {
		return fmt.Errorf("marking the account as set up: %w", err)
	}
	put := inst.Writable()
	if put.Config == nil {
		put.Config = map[string]string{}
	}
	put.Config[KeyAccount] = accountMark(id)
	if err := cl.UpdateInstance(ctx, name, put, etag); err != nil {
		return fmt.Errorf("marking the account as set up: %w", err)
	}
	return nil
}

// ensureEntry makes a colon-separated account file hold an entry whose
// field idField is id, appending line(AccountName) when none does. It
// returns the entry's name.
func ensureEntry(ctx context.Context, cl *incusapi.Client, instance, path string, idField int, id uint32, line func(string) string) (string, error) {
	data, info, err := cl.ReadFile(ctx, instance, path)
	switch {
	case incusapi.IsNotFound(err):
		info = incusapi.FileInfo{UID: 0, GID: 0, Mode: 0o644}
	case err != nil:
		return "", err
	}
	want := strconv.FormatUint(uint64(id), 10)
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Split(l, ":")
		if len(f) > idField && f[idField] == want {
			return f[0], nil
		}
	}
	text := string(data)
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	text += line(AccountName) + "\n"
	if err := cl.WriteFile(ctx, instance, path, []byte(text), info.UID, info.GID, info.Mode); err != nil {
		return "", err
	}
	return AccountName, nil
}

// ensureShadow adds a locked password entry where the image keeps a
// shadow file, so that PAM's account checks (sudo's among them) accept the
// account without it ever having a password.
func ensureShadow(ctx context.Context, cl *incusapi.Client, instance, user string) error {
	data, info, err := cl.ReadFile(ctx, instance, "/etc/shadow")
	if incusapi.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if n, _, _ := strings.Cut(l, ":"); n == user {
			return nil
		}
	}
	text := string(data)
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	text += user + ":!:::::::\n"
	return cl.WriteFile(ctx, instance, "/etc/shadow", []byte(text), info.UID, info.GID, info.Mode)
}

// ensureSudo gives the account passwordless sudo when the image has sudo.
// An image without it (no /etc/sudoers.d) has no way to root for the
// agent, which is then the whole of its privilege.
func ensureSudo(ctx context.Context, cl *incusapi.Client, instance, user string) error {
	dir, err := cl.StatFile(ctx, instance, "/etc/sudoers.d")
	if incusapi.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if dir.Type != "directory" {
		return nil
	}
	rule := fmt.Sprintf("%s ALL=(ALL:ALL) NOPASSWD: ALL\n", user)
	if data, _, err := cl.ReadFile(ctx, instance, SudoersFile); err == nil && string(data) == rule {
		return nil
	}
	// sudo ignores a rule file that others may write to.
	return cl.WriteFile(ctx, instance, SudoersFile, []byte(rule), 0, 0, 0o440)
}
