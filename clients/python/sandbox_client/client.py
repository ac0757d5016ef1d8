"""The client: SessionClaims through the Kubernetes API, commands and files
through the claim's exec API."""

from __future__ import annotations

import json
import ssl
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterable, Optional
from urllib.parse import quote, urlencode

import urllib3
import websocket
from kubernetes import client as k8s
from kubernetes import config as k8sconfig
from kubernetes.client.rest import ApiException

GROUP = "sandbox.cireilclaw.dev"
VERSION = "v1alpha1"
AGGREGATED_GROUP = "subresources." + GROUP
AGGREGATED_PREFIX = f"/apis/{AGGREGATED_GROUP}/{VERSION}"
SYSTEM_NAMESPACE = "sandbox-controller-system"
CA_CONFIGMAP = "sandbox-controller-ca"
PROTOCOL = "v5.channel.k8s.io"

# Channels of the remote-command protocol.
_STDIN, _STDOUT, _STDERR, _STATUS, _CLOSE = 0, 1, 2, 3, 255

AREAS = ("workspace", "memories", "blocks", "skills", "tasks")

# What the client takes from a sandbox at most. The agent decides how large
# a file is and how much a command prints: a sparse file of terabytes costs
# it nothing, and `yes` prints until the exec API's timeout.
MAX_READ = 16 << 20  # read_file
MAX_OUTPUT = 16 << 20  # exec's collected stdout and stderr together


class SandboxError(Exception):
    """A request the exec API or the Kubernetes API refused or failed."""


class ClaimNotReady(SandboxError):
    """The claim did not become Ready in time; reason and message are its
    Ready condition's."""

    def __init__(self, name: str, reason: str, message: str):
        super().__init__(f"SessionClaim {name} is not Ready: {reason}: {message}")
        self.reason, self.message = reason, message


class CommandRefused(SandboxError):
    """The sandbox's policy refused the command: nothing ran."""


@dataclass
class ExecResult:
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass
class Entry:
    name: str
    type: str
    size: int
    mode: int = 0
    extra: dict = field(default_factory=dict)


class SandboxClient:
    """Uses the kubeconfig as kubectl does: $KUBECONFIG or ~/.kube/config,
    its current context unless one is named."""

    def __init__(self, kubeconfig: Optional[str] = None, context: Optional[str] = None,
                 namespace: Optional[str] = None, via: Optional[str] = None,
                 api_token: Optional[str] = None):
        """via: "api-server" (the aggregated API, the kubeconfig's own
        credentials) or "node" (the claim's status.endpoint, with the
        kubeconfig's client certificate, or api_token: a token issued for
        the exec API's audience). Default: api-server when the API server
        serves it, else node."""
        self.api = k8sconfig.new_client_from_config(config_file=kubeconfig, context=context)
        self.cfg = self.api.configuration
        self.objects = k8s.CustomObjectsApi(self.api)
        self.core = k8s.CoreV1Api(self.api)
        if namespace is None:
            try:
                _, active = k8sconfig.list_kube_config_contexts(config_file=kubeconfig)
                if context:
                    active = next(c for c in k8sconfig.list_kube_config_contexts(config_file=kubeconfig)[0] if c["name"] == context)
                namespace = active.get("context", {}).get("namespace")
            except Exception:  # noqa: BLE001 - a kubeconfig without contexts
                namespace = None
        self.namespace = namespace or "default"
        self.via = via
        self.api_token = api_token
        self._node_ca: Optional[str] = None

    # --- claims -------------------------------------------------------------

    def claim(self, sandbox: str, name: Optional[str] = None, namespace: Optional[str] = None,
              worktree: Optional[dict] = None, timeout: float = 120.0) -> "Claim":
        """Creates a SessionClaim of sandbox and waits until it is Ready.
        worktree is the claim's spec.worktree (e.g. {"repository":
        "/workspace/project", "branch": "feature"}). On timeout the claim is
        released and ClaimNotReady says why it was not Ready."""
        ns = namespace or self.namespace
        name = name or f"{sandbox}-{uuid.uuid4().hex[:8]}"
        spec: dict = {"sandboxName": sandbox}
        if worktree:
            spec["worktree"] = worktree
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SessionClaim",
                "metadata": {"name": name, "namespace": ns}, "spec": spec}
        try:
            self.objects.create_namespaced_custom_object(GROUP, VERSION, ns, "sessionclaims", body)
        except ApiException as e:
            raise SandboxError(f"creating SessionClaim {ns}/{name}: {_api_message(e)}") from e
        c = Claim(self, ns, name)
        try:
            c.wait_ready(timeout)
        except BaseException:
            c.release()
            raise
        return c

    def use(self, name: str, namespace: Optional[str] = None) -> "Claim":
        """An existing claim, not released on exit unless asked."""
        return Claim(self, namespace or self.namespace, name, owned=False)

    # --- the exec API -------------------------------------------------------

    def _aggregated(self) -> bool:
        if self.via == "node":
            return False
        if self.via == "api-server":
            return True
        try:
            self.api.call_api(AGGREGATED_PREFIX, "GET", auth_settings=["BearerToken"],
                              response_type="object", _return_http_data_only=True)
            return True
        except ApiException:
            return False

    def _base(self, claim: "Claim") -> tuple[str, dict]:
        """The base URL of the claim's paths and how to reach it: TLS
        options and headers."""
        if self._aggregated():
            headers = {}
            if self.cfg.api_key.get("authorization"):
                headers["Authorization"] = self.cfg.api_key["authorization"]
            return self.cfg.host.rstrip("/") + AGGREGATED_PREFIX, {
                "ca": self.cfg.ssl_ca_cert, "cert": self.cfg.cert_file, "key": self.cfg.key_file,
                "verify": self.cfg.verify_ssl, "headers": headers}
        endpoint = claim.endpoint()
        headers = {}
        if self.api_token:
            headers["Authorization"] = "Bearer " + self.api_token
        elif not self.cfg.cert_file:
            raise SandboxError("reaching the exec API on the Sandbox's node needs the kubeconfig's client "
                               "certificate or api_token (a token for the exec API's audience); "
                               "a kubeconfig token is never sent to a node")
        return f"https://{endpoint}/api/{VERSION}", {
            "ca": self._node_ca_file(), "cert": None if self.api_token else self.cfg.cert_file,
            "key": None if self.api_token else self.cfg.key_file, "verify": True, "headers": headers,
            "server_hostname": self._sandbox_node(claim)}

    def _sandbox_node(self, claim: "Claim") -> Optional[str]:
        """The node of the claim's Sandbox, which the node's certificate
        must name whatever address the claim's endpoint gives: a node's
        controller writes that endpoint, and a taken one could point it at
        itself and take the token sent. None (the address is verified)
        when the Sandbox is on no node or this user may not read it."""
        try:
            name = claim.get().get("spec", {}).get("sandboxName")
            sb = self.objects.get_namespaced_custom_object(GROUP, VERSION, claim.namespace, "sandboxes", name)
        except ApiException:
            return None
        return sb.get("spec", {}).get("nodeName") or sb.get("status", {}).get("nodeName") or None

    def _node_ca_file(self) -> Optional[str]:
        """The exec API's CA, as the cluster publishes it; else the
        kubeconfig's."""
        if self._node_ca is None:
            try:
                cm = self.core.read_namespaced_config_map(CA_CONFIGMAP, SYSTEM_NAMESPACE)
                pem = (cm.data or {}).get("ca.crt")
            except ApiException:
                pem = None
            if pem:
                f = tempfile.NamedTemporaryFile("w", suffix=".crt", delete=False)
                f.write(pem)
                f.close()
                self._node_ca = f.name
            else:
                self._node_ca = self.cfg.ssl_ca_cert or ""
        return self._node_ca or None


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body).get("message") or str(e)
    except Exception:  # noqa: BLE001
        return f"{e.status} {e.reason}"


class Claim:
    """A SessionClaim: use it as a context manager to release it at the end."""

    def __init__(self, client: SandboxClient, namespace: str, name: str, owned: bool = True):
        self.client, self.namespace, self.name, self.owned = client, namespace, name, owned

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        if self.owned:
            self.release()

    def get(self) -> dict:
        return self.client.objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "sessionclaims", self.name)

    def condition(self, typ: str) -> Optional[dict]:
        for c in self.get().get("status", {}).get("conditions", []) or []:
            if c.get("type") == typ:
                return c
        return None

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Waits for Ready, and for WorktreeReady when the claim asked for
        a worktree."""
        deadline = time.monotonic() + timeout
        last: Optional[dict] = None
        while True:
            claim = self.get()
            conds = {c.get("type"): c for c in claim.get("status", {}).get("conditions", []) or []}
            last = conds.get("Ready")
            if last and last.get("status") == "True" and claim.get("spec", {}).get("worktree"):
                last = conds.get("WorktreeReady")
            if last and last.get("status") == "True":
                return
            if time.monotonic() >= deadline:
                reason = (last or {}).get("reason", "NoCondition")
                message = (last or {}).get("message", "the controller has not reported on the claim")
                raise ClaimNotReady(f"{self.namespace}/{self.name}", reason, message)
            time.sleep(0.2)

    def endpoint(self) -> str:
        ep = self.get().get("status", {}).get("endpoint")
        if not ep:
            raise SandboxError(f"SessionClaim {self.namespace}/{self.name} has no status.endpoint yet")
        return ep

    def release(self, timeout: float = 60.0) -> None:
        """Deletes the claim and waits until it is gone."""
        try:
            self.client.objects.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, "sessionclaims", self.name)
        except ApiException as e:
            if e.status == 404:
                return
            raise SandboxError(f"releasing SessionClaim {self.namespace}/{self.name}: {_api_message(e)}") from e
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.get()
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            time.sleep(0.2)

    # --- commands -----------------------------------------------------------

    def exec(self, argv: Iterable[str], stdin: Optional[bytes | str | BinaryIO] = None,
             on_stdout: Optional[Callable[[bytes], None]] = None,
             on_stderr: Optional[Callable[[bytes], None]] = None,
             timeout: Optional[float] = None,
             max_output: Optional[int] = MAX_OUTPUT) -> ExecResult:
        """Runs one command (an argv list, never a shell line). Output is
        collected, and streamed to on_stdout/on_stderr as it comes. A
        command the policy refuses raises CommandRefused. Past max_output
        bytes of stdout and stderr together the command is ended and
        SandboxError raised; max_output=None keeps everything."""
        argv = list(argv)
        if not argv:
            raise ValueError("argv: give the command and its arguments")
        base, how = self.client._base(self)
        q = [("command", a) for a in argv] + [("stdout", "true"), ("stderr", "true"),
                                                ("stdin", "true" if stdin is not None else "false")]
        url = "wss://" + base.split("://", 1)[1] + self._path("exec") + "?" + urlencode(q)
        sslopt = {"cert_reqs": ssl.CERT_REQUIRED if how["verify"] else ssl.CERT_NONE}
        if how["ca"]:
            sslopt["ca_certs"] = how["ca"]
        if how["cert"]:
            sslopt["certfile"], sslopt["keyfile"] = how["cert"], how["key"]
        if not how["verify"]:
            sslopt["check_hostname"] = False
        if how.get("server_hostname"):
            sslopt["server_hostname"] = how["server_hostname"]
        headers = [f"{k}: {v}" for k, v in how["headers"].items()]
        try:
            ws = websocket.create_connection(url, subprotocols=[PROTOCOL], sslopt=sslopt, header=headers,
                                             timeout=timeout)
        except websocket.WebSocketBadStatusException as e:
            raise SandboxError(f"exec in SessionClaim {self.namespace}/{self.name}: {_status_message(e)}") from e
        out, err = bytearray(), bytearray()
        status: Optional[dict] = None
        writer = None
        if stdin is not None:
            writer = threading.Thread(target=_send_stdin, args=(ws, stdin), daemon=True)
            writer.start()
        try:
            while True:
                try:
                    op, frame = ws.recv_data()
                except websocket.WebSocketConnectionClosedException:
                    break
                if op == websocket.ABNF.OPCODE_CLOSE or not frame:
                    break
                ch, data = frame[0], bytes(frame[1:])
                if ch in (_STDOUT, _STDERR) and max_output is not None and len(out) + len(err) + len(data) > max_output:
                    raise SandboxError(f"exec {argv[0]} in SessionClaim {self.namespace}/{self.name}: more than "
                                       f"max_output={max_output} bytes of output; the command was ended (pass a "
                                       f"larger max_output, or None to keep it all)")
                if ch == _STDOUT:
                    out += data
                    if on_stdout:
                        on_stdout(data)
                elif ch == _STDERR:
                    err += data
                    if on_stderr:
                        on_stderr(data)
                elif ch == _STATUS:
                    status = json.loads(data)
        finally:
            ws.close()
        return ExecResult(_exit_code(status), bytes(out), bytes(err))

    # --- files --------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        """A file's bytes, at most MAX_READ of them."""
        r = self._files("GET", path, preload=False)
        try:
            kind = r.headers.get("X-Entry-Type")
            if kind != "file":
                # The agent may have put a directory where the file was.
                raise SandboxError(f"reading {path}: it is a {kind or 'thing the server did not name'}, "
                                   f"not a regular file")
            size = int(r.headers.get("Content-Length") or 0)
            if size > MAX_READ:
                raise SandboxError(f"reading {path}: {size} bytes is more than the {MAX_READ} read_file reads")
            data = r.read(MAX_READ + 1)
            if len(data) > MAX_READ:
                raise SandboxError(f"reading {path}: more than the {MAX_READ} bytes read_file reads")
            return data
        finally:
            r.release_conn()

    def write_file(self, path: str, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        self._files("PUT", path, body=data)

    def list(self, path: str = "/workspace") -> list[Entry]:
        r = self._files("GET", path, preload=False)
        try:
            if r.headers.get("X-Entry-Type") != "dir":
                raise SandboxError(f"{path} is not a directory")
            data = r.read(MAX_READ + 1)
        finally:
            r.release_conn()
        if len(data) > MAX_READ:
            raise SandboxError(f"listing {path}: more than the {MAX_READ} bytes of listing list reads")
        return [Entry(name=e["name"], type=e["type"], size=e.get("size", 0), mode=e.get("mode", 0), extra=e)
                for e in json.loads(data)]

    def remove(self, path: str, recursive: bool = False) -> None:
        self._files("DELETE", path, query={"recursive": "true"} if recursive else None)

    def _path(self, what: str) -> str:
        return f"/namespaces/{quote(self.namespace, safe='')}/sessionclaims/{quote(self.name, safe='')}/{what}"

    def _files(self, method: str, path: str, body: Optional[bytes] = None, query: Optional[dict] = None,
               preload: bool = True):
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] not in AREAS:
            raise SandboxError(f"{path}: a sandbox path begins with one of the areas: /" + ", /".join(AREAS))
        base, how = self.client._base(self)
        url = base + self._path("files/" + "/".join(quote(p, safe="") for p in parts))
        if query:
            url += "?" + urlencode(query)
        tls = {"server_hostname": how["server_hostname"]} if how.get("server_hostname") else {}
        pool = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED" if how["verify"] else "CERT_NONE", ca_certs=how["ca"],
            cert_file=how["cert"], key_file=how["key"], assert_hostname=None if how["verify"] else False, **tls)
        r = pool.request(method, url, body=body, headers=how["headers"], preload_content=preload)
        if r.status // 100 != 2:
            data = r.data if preload else r.read(64 << 10)
            raise SandboxError(f"{method} {path} in SessionClaim {self.namespace}/{self.name}: "
                               f"{_body_message(data)} ({r.status})")
        return r


def _send_stdin(ws: websocket.WebSocket, stdin) -> None:
    try:
        if isinstance(stdin, str):
            stdin = stdin.encode()
        if isinstance(stdin, (bytes, bytearray)):
            for i in range(0, len(stdin), 32 << 10):
                ws.send_binary(bytes([_STDIN]) + bytes(stdin[i:i + (32 << 10)]))
        else:
            while chunk := stdin.read(32 << 10):
                ws.send_binary(bytes([_STDIN]) + chunk)
        ws.send_binary(bytes([_CLOSE, _STDIN]))
    except (websocket.WebSocketException, OSError):
        pass  # the command ended first


def _exit_code(status: Optional[dict]) -> int:
    if status is None:
        raise SandboxError("the exec API closed the stream without the command's status")
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" or cause.get("type") == "ExitCode":
            return int(cause.get("message", "1"))
    if status.get("reason") == "CommandRefused":
        raise CommandRefused(status.get("message", "refused"))
    raise SandboxError(status.get("message") or json.dumps(status))


def _body_message(data: bytes) -> str:
    try:
        return json.loads(data).get("message") or data.decode(errors="replace")
    except Exception:  # noqa: BLE001
        return data.decode(errors="replace").strip()


def _status_message(e: websocket.WebSocketBadStatusException) -> str:
    body = getattr(e, "resp_body", None) or b""
    return f"{_body_message(body) if body else e}"


__all__ = ["SandboxClient", "Claim", "ExecResult", "Entry", "SandboxError", "ClaimNotReady", "CommandRefused"]
