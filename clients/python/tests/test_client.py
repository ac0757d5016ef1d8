"""Against a running control plane and controller (make run's): the Go
harness test/e2e/clients starts them, makes a Sandbox and runs this with
SANDBOX_KUBECONFIG, SANDBOX_NAMESPACE and SANDBOX_NAME set."""

import os

import pytest

from sandbox_client import ClaimNotReady, CommandRefused, SandboxClient, SandboxError

KUBECONFIG = os.environ.get("SANDBOX_KUBECONFIG")
NAMESPACE = os.environ.get("SANDBOX_NAMESPACE", "default")
SANDBOX = os.environ.get("SANDBOX_NAME", "python")

pytestmark = pytest.mark.skipif(not KUBECONFIG, reason="run through test/e2e/clients, which starts a control plane")


@pytest.fixture(scope="module")
def client():
    return SandboxClient(kubeconfig=KUBECONFIG, namespace=NAMESPACE)


def test_claim_exec_files_release(client):
    with client.claim(SANDBOX, timeout=120) as claim:
        r = claim.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")

        streamed = []
        r = claim.exec(["cat"], stdin=b"through stdin\n", on_stdout=streamed.append)
        assert r.exit_code == 0 and r.stdout == b"through stdin\n" and b"".join(streamed) == b"through stdin\n"

        claim.exec(["sh", "-c", "mkdir -p /workspace/py"])
        claim.write_file("/workspace/py/notes.txt", "from python\n")
        assert claim.read_file("/workspace/py/notes.txt") == b"from python\n"
        assert claim.exec(["cat", "/workspace/py/notes.txt"]).stdout == b"from python\n"
        assert [e.name for e in claim.list("/workspace/py")] == ["notes.txt"]
        claim.remove("/workspace/py", recursive=True)
        with pytest.raises(SandboxError):
            claim.read_file("/workspace/py/notes.txt")

        with pytest.raises(CommandRefused) as refused:
            claim.exec(["curl", "http://example.com"])
        assert "curl" in str(refused.value)
        with pytest.raises(SandboxError):
            claim.write_file("/blocks/x", "read-only")
        name = claim.name
    with pytest.raises(Exception):
        client.use(name).get()


def test_a_claim_of_a_missing_sandbox_says_why(client):
    with pytest.raises(ClaimNotReady) as e:
        client.claim("no-such-sandbox", timeout=3)
    assert e.value.reason in ("SandboxNotFound", "NoCondition")
