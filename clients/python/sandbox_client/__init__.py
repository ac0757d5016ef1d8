"""Claim a sandbox-controller sandbox, run commands and move files in it.

    from sandbox_client import SandboxClient

    client = SandboxClient()                      # the kubeconfig, as kubectl
    with client.claim("alice", namespace="team-a", timeout=60) as claim:
        result = claim.exec(["git", "status"])
        print(result.exit_code, result.stdout)
        claim.write_file("/workspace/notes.txt", b"hello\\n")
        print(claim.read_file("/workspace/notes.txt"))
    # leaving the block releases the claim

A claim is a SessionClaim: the controller starts the Sandbox's instance
while claims hold it. Commands and files go to the claim's exec API: on
the Sandbox's node (status.endpoint), with the kubeconfig's client
certificate, or through the API server's aggregated API when it serves it.
"""

from .client import (  # noqa: F401
    MAX_OUTPUT,
    MAX_READ,
    Claim,
    ClaimNotReady,
    CommandRefused,
    Entry,
    ExecResult,
    SandboxClient,
    SandboxError,
)
