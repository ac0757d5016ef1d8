// Command agentloop is an agent loop in a few lines: claim a sandbox with
// a git worktree of its own, look around, edit a file in the worktree,
// show the diff.
//
//	go run ./examples/go/agentloop -n NAMESPACE SANDBOX REPOSITORY
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/clients/go/sandboxclient"
)

func main() {
	ns := flag.String("n", "default", "the Sandbox's namespace")
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig (default $KUBECONFIG or ~/.kube/config)")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: agentloop [-n NAMESPACE] SANDBOX REPOSITORY")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *ns, flag.Arg(0), flag.Arg(1)); err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, ns, sandbox, repository string) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return err
	}
	c, err := sandboxclient.New(cfg, sandboxclient.Options{Namespace: ns})
	if err != nil {
		return err
	}
	ctx := context.Background()
	claim, err := c.Claim(ctx, sandbox, sandboxclient.ClaimOptions{
		Worktree: &v1alpha1.WorktreeSpec{Repository: repository, CreateBranch: true}})
	if err != nil {
		return err
	}
	defer func() { _ = claim.Release(context.Background()) }()
	sc, err := claim.Get(ctx)
	if err != nil {
		return err
	}
	wt := sc.Status.Worktree.Path
	fmt.Println("worktree", wt)
	for _, argv := range [][]string{{"git", "-C", wt, "status", "--short", "--branch"}, {"git", "-C", wt, "log", "--oneline", "-1"}} {
		fmt.Printf("$ %s\n", strings.Join(argv, " "))
		if _, err := claim.Exec(ctx, argv, nil, os.Stdout, os.Stderr); err != nil {
			return err
		}
	}
	if err := claim.WriteFile(ctx, wt+"/NOTES.md", []byte("# Notes\n\nWritten by the agent.\n")); err != nil {
		return err
	}
	if _, err := claim.Exec(ctx, []string{"git", "-C", wt, "add", "--intent-to-add", "NOTES.md"}, nil, nil, os.Stderr); err != nil {
		return err
	}
	if _, err := claim.Exec(ctx, []string{"git", "-C", wt, "diff"}, nil, os.Stdout, os.Stderr); err != nil {
		return err
	}
	if _, err := claim.Exec(ctx, []string{"curl", "https://example.com"}, nil, nil, nil); errors.Is(err, sandboxclient.ErrRefused) {
		fmt.Println("refused, as it should be:", err)
	} else {
		return fmt.Errorf("curl was not refused: %w", err)
	}
	return nil
}
