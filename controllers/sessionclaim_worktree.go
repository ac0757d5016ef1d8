package controllers

// The claim's side of the worktree handshake; sandbox_worktrees.go says
// what each side owns.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/sandboxclass"
	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/internal/boundedbuf"
	"github.com/cireilclaw/sandbox-controller/internal/worktree"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// claimRepo is where a claim's worktree lives: the repository inside one of
// the Sandbox's mounts.
type claimRepo struct {
	repo worktree.Repo
	// sandboxPath is the repository inside the sandbox, /workspace/<repository>.
	sandboxPath string
	instance    runtimes.Instance
	rt          runtimes.Runtime
}

func worktreeName(c *v1alpha1.SessionClaim) string {
	if c.Spec.Worktree.Name != "" {
		return c.Spec.Worktree.Name
	}
	return c.Name
}

// resolveRepo finds the read-write mount that holds the claim's repository.
func (r *SessionClaimReconciler) resolveRepo(ctx context.Context, c *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) (*claimRepo, error) {
	if errs := v1alpha1.ValidateWorktree(c.Spec.Worktree); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	rt, ok := r.Runtimes[sb.Spec.BackendOrDefault()]
	if !ok {
		return nil, fmt.Errorf("this controller was not started with the %s backend", sb.Spec.BackendOrDefault())
	}
	// Host git runs in the mount only when the Sandbox's class allows the
	// mount, and in the source the class checked (links resolved).
	// The claim's side reads only the instance's name, its identity and
	// the Sandbox's own mounts; the git directory binds are the Sandbox's
	// side (sandbox_worktrees.go).
	in, _, err := sandboxclass.Describe(ctx, r.Client, sb, r.Host)
	if err != nil {
		return nil, err
	}
	want := "/workspace/" + c.Spec.Worktree.Repository
	var targets []string
	for _, m := range in.Mounts {
		targets = append(targets, m.Target)
		if want != m.Target && !strings.HasPrefix(want, m.Target+"/") {
			continue
		}
		if m.ReadOnly {
			return nil, fmt.Errorf("repository %s is inside the read-only mount %s; a worktree needs a rw mount", want, m.Target)
		}
		root, err := areas.OpenRootAt(m.Target, in.SourceDir(m), false)
		if err != nil {
			return nil, fmt.Errorf("opening mount %s (%s): %w", m.Target, m.Source, err)
		}
		// What the controller reads, writes and removes in the mount
		// (the worktree's administrative files, info/exclude, a clean
		// worktree) it does as the agent: a file the agent cannot read
		// (another user's, in a shared mount, or one swapped in by a
		// link) never reaches a status message, and what it writes is
		// the agent's.
		root = root.As(areas.Identity{UID: in.Identity.UID, GID: in.Identity.GID})
		return &claimRepo{
			repo: worktree.Repo{
				Mount: root, Rel: strings.TrimPrefix(strings.TrimPrefix(want, m.Target), "/"),
				// Host git runs as the agent: it can do to the repository no
				// more than the agent can (zero means the package's fallback,
				// never root).
				As:         worktree.Identity{UID: in.Identity.UID, GID: in.Identity.GID},
				GitTimeout: r.GitTimeout,
			},
			sandboxPath: want,
			instance:    in,
			rt:          rt,
		}, nil
	}
	return nil, fmt.Errorf("repository %s is not inside any mount of Sandbox %q (mount targets: %v)", want, sb.Name, targets)
}

// reconcileWorktree adds the claim's worktree on the host, checks it out
// inside the sandbox once the sandbox mounts its git directory, and reports
// WorktreeReady and GitHealthy.
func (r *SessionClaimReconciler) reconcileWorktree(ctx context.Context, c *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox, f *claimFacts) (ctrl.Result, error) {
	if c.Spec.Worktree == nil {
		c.Status.Worktree = nil
		f.worktree = worktreeNone
		return ctrl.Result{}, nil
	}
	fail := func(err error) {
		// The worktree package's errors carry their own reason and words of
		// the product's, never git's output.
		reason := worktree.ReasonOf(err)
		if reason == "" {
			reason = v1alpha1.ReasonWorktreeFailed
		}
		f.worktree, f.worktreeProblem = worktreeFailed, problem{reason: reason, message: boundedMessage(err.Error())}
	}
	cr, err := r.resolveRepo(ctx, c, sb)
	if err != nil {
		// A spec or Sandbox change brings the claim back; retrying alone cannot help.
		fail(err)
		return ctrl.Result{}, nil
	}
	name := worktreeName(c)
	wt := worktree.For(cr.repo, name)
	if st := c.Status.Worktree; st == nil || !st.CheckedOut {
		if v, ok := r.checkedOut.Load(c.UID); ok && v.(*v1alpha1.WorktreeStatus).HostPath == wt.HostPath {
			c.Status.Worktree = v.(*v1alpha1.WorktreeStatus).DeepCopy()
		}
	}
	if st := c.Status.Worktree; st == nil || !st.CheckedOut || st.HostPath != wt.HostPath {
		// Taking the worktree, which another claim may share, is never
		// interleaved with that claim's release of it: the release either
		// sees this claim's record in checkedOut or goes first.
		unlock, err := r.worktreeLocks.lock(ctx, wt.HostPath)
		if err != nil {
			fail(fmt.Errorf("waiting for another claim's release of worktree %s: %w", wt.HostPath, err))
			return ctrl.Result{}, err
		}
		defer unlock()
	}
	added := false
	if st := c.Status.Worktree; st == nil || !st.CheckedOut || st.HostPath != wt.HostPath {
		// Once checked out the worktree is never made again: if it breaks,
		// the health check below says how, rather than a fresh one hiding it.
		if wt, err = worktree.Add(ctx, cr.repo, worktree.Spec{Name: name, Ref: c.Spec.Worktree.Ref, CreateBranch: c.Spec.Worktree.CreateBranch}); err != nil {
			fail(err)
			return ctrl.Result{}, err
		}
		added = true
	}
	st := c.Status.Worktree
	if st == nil || st.HostPath != wt.HostPath {
		st = &v1alpha1.WorktreeStatus{Head: wt.Head, Branch: wt.Branch}
		c.Status.Worktree = st
	}
	st.Path = cr.sandboxPath + "/" + worktree.Dir + "/" + name
	st.HostPath, st.GitCommonDir = wt.HostPath, wt.GitCommonDir
	if added {
		st.RelativePaths = wt.Relative
	}

	// Relative links resolve through the repository's own mount; absolute
	// ones need the git directory at its host path.
	mounted := st.RelativePaths || slices.Contains(sb.Status.MountedGitDirs, wt.GitCommonDir)
	if !mounted || !conditionTrue(sb.Status.Conditions, v1alpha1.ConditionReady) {
		msg := fmt.Sprintf("worktree %s added; it is checked out once Sandbox %q is Ready and mounts %s", st.Path, sb.Name, wt.GitCommonDir)
		if st.RelativePaths {
			msg = fmt.Sprintf("worktree %s added; it is checked out once Sandbox %q is Ready", st.Path, sb.Name)
		}
		f.worktree, f.worktreeMessage = worktreeWaiting, msg
		return ctrl.Result{}, nil
	}
	if !st.CheckedOut {
		// A worktree holding more than its .git file was checked out
		// already: by this claim before its status write was lost, or for
		// another claim that names the same worktree. Checking it out
		// again would reset the work in it.
		untouched, err := worktree.Untouched(cr.repo, wt)
		if err != nil {
			fail(err)
			return ctrl.Result{}, err
		}
		if untouched {
			if err := r.checkout(ctx, cr, st.Path); err != nil {
				fail(err)
				return ctrl.Result{}, err
			}
			log.FromContext(ctx).Info("worktree checked out", "path", st.Path, "branch", st.Branch, "head", st.Head)
		} else {
			log.FromContext(ctx).Info("worktree holds files already; taken as checked out", "path", st.Path)
		}
		st.CheckedOut = true
		r.checkedOut.Store(c.UID, st.DeepCopy())
	}
	f.worktree, f.worktreeMessage = worktreeCheckedOut, fmt.Sprintf("worktree %s checked out at %s", st.Path, describeRef(st))

	if h := worktree.Check(ctx, cr.repo, wt); h.Reason != worktree.ReasonHealthy {
		f.git = gitHealth{reason: h.Reason, message: h.Message}
	} else if _, stderr, err := r.git(ctx, cr, "-C", st.Path, "rev-parse", "--verify", "HEAD"); err != nil {
		logGitOutput(ctx, "probe inside the sandbox failed", st.Path, err, stderr)
		f.git = gitHealth{reason: v1alpha1.ReasonProbeFailed,
			message: boundedMessage(fmt.Sprintf("git rev-parse inside the sandbox failed: %v; the controller log has git's output", err))}
	} else {
		f.git = gitHealth{healthy: true, reason: v1alpha1.ReasonHealthy, message: h.Message + "; git works inside the sandbox"}
	}
	return ctrl.Result{RequeueAfter: r.healthInterval()}, nil
}

// checkout checks the worktree at path out inside the sandbox, where the
// repository's own filters may run.
func (r *SessionClaimReconciler) checkout(ctx context.Context, cr *claimRepo, path string) error {
	if _, stderr, err := r.git(ctx, cr, "-C", path, "reset", "--hard", "--quiet"); err != nil {
		logGitOutput(ctx, "checkout inside the sandbox failed", path, err, stderr)
		return fmt.Errorf("checking out worktree %s inside the sandbox: %w; the controller log has git's output", path, err)
	}
	return nil
}

// maxGitLog bounds how much of git's output goes to the log.
const maxGitLog = 4 << 10

// logGitOutput logs what git printed, bounded: the agent decides what git
// prints inside its sandbox, so it goes to the log and never into a
// condition or an event.
func logGitOutput(ctx context.Context, what, path string, err error, stderr string) {
	if len(stderr) > maxGitLog {
		stderr = stderr[:maxGitLog] + "…(truncated)"
	}
	log.FromContext(ctx).Info("worktree: "+what, "path", path, "error", err.Error(), "stderr", stderr)
}

// maxConditionMessage bounds a condition's message: it may quote paths
// and values from the agent's files.
const maxConditionMessage = 1024

func boundedMessage(s string) string { return boundedbuf.Cut(s, maxConditionMessage) }

func describeRef(st *v1alpha1.WorktreeStatus) string {
	if st.Branch != "" {
		return "branch " + st.Branch
	}
	return "commit " + st.Head
}

// releaseWorktree removes a clean worktree when its claim goes and keeps a
// dirty one (or one whose state cannot be read) on disk, and one another
// live claim of the Sandbox uses (its release is only logged). The claim's
// deletion completes either way.
func (r *SessionClaimReconciler) releaseWorktree(ctx context.Context, c *v1alpha1.SessionClaim, sb *v1alpha1.Sandbox) {
	r.checkedOut.Delete(c.UID)
	st := c.Status.Worktree
	if c.Spec.Worktree == nil || st == nil {
		return
	}
	keep := func(why string) {
		st.Kept = true
		msg := fmt.Sprintf("kept worktree %s on disk: %s; its branch and commits stay", st.HostPath, why)
		log.FromContext(ctx).Info(msg)
		r.Recorder.Event(c, "Warning", v1alpha1.ReasonWorktreeKept, msg)
		if sb != nil {
			r.Recorder.Event(sb, "Warning", v1alpha1.ReasonWorktreeKept, fmt.Sprintf("claim %s: %s", c.Name, msg))
		}
	}
	if sb == nil {
		keep(fmt.Sprintf("Sandbox %q is gone, so its uncommitted changes cannot be checked", c.Spec.SandboxName))
		return
	}
	unlock, err := r.worktreeLocks.lock(ctx, st.HostPath)
	if err != nil {
		keep(fmt.Sprintf("waiting for another claim taking it: %v", err))
		return
	}
	defer unlock()
	other, err := r.sharedWith(ctx, c, st.HostPath)
	if err != nil {
		keep(err.Error())
		return
	}
	if other != "" {
		log.FromContext(ctx).Info("released worktree; kept on disk for another claim", "path", st.HostPath, "claim", other)
		return
	}
	cr, err := r.resolveRepo(ctx, c, sb)
	if err != nil {
		keep(err.Error())
		return
	}
	wt := worktree.For(cr.repo, worktreeName(c))
	var dirty bool
	if st.CheckedOut {
		out, stderr, err := r.git(ctx, cr, "-C", st.Path, "status", "--porcelain=v2", "--branch", "--untracked-files=normal")
		if err != nil {
			logGitOutput(ctx, "status inside the sandbox failed", st.Path, err, stderr)
			keep(fmt.Sprintf("git status inside the sandbox failed: %v; the controller log has git's output", err))
			return
		}
		if dirty, err = statusDirty(out); err != nil {
			keep(err.Error())
			return
		}
		if !dirty && detachedAway(out, st.Head) {
			keep(fmt.Sprintf("its detached HEAD has moved from %s, and commits made there are on no branch; removing the worktree would leave them to git gc", st.Head))
			return
		}
	} else {
		// Never checked out: only files someone put there can be work.
		untouched, err := worktree.Untouched(cr.repo, wt)
		if err != nil {
			keep(err.Error())
			return
		}
		dirty = !untouched
	}
	err = worktree.Remove(cr.repo, wt, dirty)
	switch {
	case errors.Is(err, worktree.ErrDirty):
		keep("it has uncommitted changes")
	case err != nil:
		keep(err.Error())
	default:
		log.FromContext(ctx).Info("removed clean worktree", "path", st.HostPath, "branch", st.Branch)
	}
}

// sharedWith names a live claim of c's Sandbox, not c, whose worktree is
// the one at hostPath: "" when none is. A claim being deleted is not live,
// so of two claims deleted at once the second to look removes the
// worktree; both look under the worktree's lock, in the one cache, which
// showed each its own deletion before it looked.
func (r *SessionClaimReconciler) sharedWith(ctx context.Context, c *v1alpha1.SessionClaim, hostPath string) (string, error) {
	var list v1alpha1.SessionClaimList
	if err := r.List(ctx, &list, client.InNamespace(c.Namespace), client.MatchingFields{indexClaimSandbox: c.Spec.SandboxName}); err != nil {
		return "", fmt.Errorf("listing the claims of Sandbox %q to see whether another one uses the worktree: %w", c.Spec.SandboxName, err)
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID != c.UID && o.DeletionTimestamp.IsZero() && r.records(o, hostPath) {
			return o.Name, nil
		}
	}
	return "", nil
}

// records says whether claim o's worktree is the one at hostPath: its
// status says so, or this process checked it out for o and the cache has
// not shown that status write yet.
func (r *SessionClaimReconciler) records(o *v1alpha1.SessionClaim, hostPath string) bool {
	if st := o.Status.Worktree; st != nil && st.HostPath == hostPath {
		return true
	}
	v, ok := r.checkedOut.Load(o.UID)
	return ok && v.(*v1alpha1.WorktreeStatus).HostPath == hostPath
}

// worktreeLocks serialises, worktree by worktree (by host path), the
// claims that take it and those that release it.
type worktreeLocks struct {
	mu   sync.Mutex
	held map[string]*worktreeLock
}

type worktreeLock struct {
	turn  chan struct{}
	users int
}

// lock waits for the worktree at hostPath, or for ctx to end, and returns
// what lets it go. A worktree no one waits for holds no memory.
func (l *worktreeLocks) lock(ctx context.Context, hostPath string) (func(), error) {
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*worktreeLock{}
	}
	e := l.held[hostPath]
	if e == nil {
		e = &worktreeLock{turn: make(chan struct{}, 1)}
		l.held[hostPath] = e
	}
	e.users++
	l.mu.Unlock()
	select {
	case e.turn <- struct{}{}:
		return func() { <-e.turn; l.leave(hostPath, e) }, nil
	case <-ctx.Done():
		l.leave(hostPath, e)
		return nil, ctx.Err()
	}
}

func (l *worktreeLocks) leave(hostPath string, e *worktreeLock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.users--; e.users == 0 {
		delete(l.held, hostPath)
	}
}

// statusDirty reads the output of git status --porcelain=v2 --branch:
// header lines begin "# ", every other line is a change. git always prints
// the branch.oid header first, so output without it is no answer (cut
// short on its way out of the sandbox, say), never a clean worktree: the
// files are removed only on git's positive word.
func statusDirty(out string) (bool, error) {
	header := false
	for line := range strings.SplitSeq(out, "\n") {
		switch {
		case strings.HasPrefix(line, "# branch.oid "):
			header = true
		case line == "" || strings.HasPrefix(line, "# "):
		default:
			return true, nil
		}
	}
	if !header {
		return false, errors.New("git status inside the sandbox answered without its branch header, so its answer is incomplete and the changes could not be read")
	}
	return false, nil
}

// detachedAway reads the output of git status --porcelain=v2 --branch and
// says whether HEAD is detached at a commit other than made, the one the
// worktree was added at: commits made on a detached HEAD are on no branch,
// and only the worktree's own HEAD and reflog hold them.
func detachedAway(out, made string) bool {
	var oid string
	detached := false
	for line := range strings.SplitSeq(out, "\n") {
		if v, ok := strings.CutPrefix(line, "# branch.oid "); ok {
			oid = v
		}
		detached = detached || line == "# branch.head (detached)"
	}
	return detached && oid != made
}

// git runs git inside the claim's sandbox and returns stdout and stderr.
func (r *SessionClaimReconciler) git(ctx context.Context, cr *claimRepo, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, errb := &cappedBuffer{max: maxGitStdout}, &cappedBuffer{max: maxGitLog}
	st, err := cr.rt.Exec(ctx, cr.instance.Name, runtimes.ExecRequest{Argv: append([]string{"git"}, args...), Stdout: out, Stderr: errb})
	if err != nil {
		return out.String(), errb.String(), err
	}
	if st.Code != 0 {
		return out.String(), errb.String(), fmt.Errorf("git %s exited with %d", args[len(args)-1], st.Code)
	}
	return out.String(), errb.String(), nil
}

// maxGitStdout bounds what the controller keeps of a git command's output
// inside the sandbox: it only asks whether git status printed anything.
const maxGitStdout = 64 << 10

// cappedBuffer keeps the first max bytes written to it and drops the rest
// while reporting them written, so the command runs to its end.
type cappedBuffer struct {
	max int
	buf bytes.Buffer
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string { return b.buf.String() }
