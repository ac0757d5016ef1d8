"""An agent loop in a few lines: claim a sandbox with a git worktree of
its own, look around, edit a file in the worktree, show the diff.

    python3 agent_loop.py SANDBOX REPOSITORY [--namespace NS] [--kubeconfig F]

REPOSITORY is the repository's path below /workspace/ (a rw mount of the
Sandbox, or a directory below one)."""

import argparse
import sys

from sandbox_client import CommandRefused, SandboxClient


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("sandbox")
    p.add_argument("repository")
    p.add_argument("--namespace")
    p.add_argument("--kubeconfig")
    a = p.parse_args()

    client = SandboxClient(kubeconfig=a.kubeconfig, namespace=a.namespace)
    with client.claim(a.sandbox, worktree={"repository": a.repository, "createBranch": True}) as claim:
        wt = claim.get()["status"]["worktree"]["path"]
        print(f"worktree {wt}")
        for argv in (["git", "-C", wt, "status", "--short", "--branch"], ["git", "-C", wt, "log", "--oneline", "-1"]):
            r = claim.exec(argv)
            print(f"$ {' '.join(argv)}  (exit {r.exit_code})\n{r.stdout.decode()}{r.stderr.decode()}", end="")
        claim.write_file(f"{wt}/NOTES.md", "# Notes\n\nWritten by the agent.\n")
        claim.exec(["git", "-C", wt, "add", "--intent-to-add", "NOTES.md"])
        print(claim.exec(["git", "-C", wt, "diff"]).stdout.decode(), end="")
        try:
            claim.exec(["curl", "https://example.com"])
        except CommandRefused as e:
            print(f"refused, as it should be: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
