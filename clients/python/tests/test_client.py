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


def test_what_the_agent_sizes_is_bounded(client):
    with client.claim(SANDBOX, timeout=120) as claim:
        # A sparse file one byte past the bound costs the agent nothing.
        r = claim.exec(["sh", "-c", "mkdir -p /workspace/big && truncate -s 16777217 /workspace/big/file"])
        assert r.exit_code == 0, r.stderr
        with pytest.raises(SandboxError) as e:
            claim.read_file("/workspace/big/file")
        assert "more than" in str(e.value)
        # A directory where a file was is not read as the file.
        with pytest.raises(SandboxError) as e:
            claim.read_file("/workspace/big")
        assert "not a regular file" in str(e.value)
        # Output past max_output ends the command.
        with pytest.raises(SandboxError) as e:
            claim.exec(["sh", "-c", "while :; do echo 0123456789abcdef0123456789abcdef; done"], max_output=1 << 20)
        assert "max_output" in str(e.value)
        assert claim.exec(["sh", "-c", "echo small"], max_output=16).stdout == b"small\n"
        claim.remove("/workspace/big", recursive=True)
