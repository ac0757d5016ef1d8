// Claim a sandbox-controller sandbox, run commands and move files in it,
// with the user's kubeconfig as kubectl uses it.
//
//   const client = SandboxClient.fromKubeconfig();
//   await using claim = await client.claim("alice", { namespace: "team-a" });
//   const r = await claim.exec(["git", "status"]);
//
// A claim is a SessionClaim: the controller starts the Sandbox's instance
// while claims hold it. Commands and files go to the claim's exec API:
// through the API server's aggregated API when it serves it, else on the
// Sandbox's node (status.endpoint) with the kubeconfig's client
// certificate.

import { readFileSync } from "node:fs";
import * as https from "node:https";
import { homedir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import WebSocket from "ws";
import { parse } from "yaml";

export const GROUP = "sandbox.cireilclaw.dev";
export const VERSION = "v1alpha1";
export const AGGREGATED_PREFIX = `/apis/subresources.${GROUP}/${VERSION}`;
const SYSTEM_NAMESPACE = "sandbox-controller-system";
const CA_CONFIGMAP = "sandbox-controller-ca";
const PROTOCOL = "v5.channel.k8s.io";
const AREAS = ["workspace", "memories", "blocks", "skills", "tasks"];
const STDIN = 0, STDOUT = 1, STDERR = 2, STATUS = 3, CLOSE = 255;

/** A request the exec API or the Kubernetes API refused or failed. */
export class SandboxError extends Error {}

/** The claim did not become Ready in time: reason and message are its Ready condition's. */
export class ClaimNotReady extends SandboxError {
  constructor(name: string, readonly reason: string, readonly detail: string) {
    super(`SessionClaim ${name} is not Ready: ${reason}: ${detail}`);
  }
}

/** The sandbox's policy refused the command: nothing ran. */
export class CommandRefused extends SandboxError {}

export interface ExecResult {
  exitCode: number;
  stdout: Buffer;
  stderr: Buffer;
}

export interface Entry {
  name: string;
  type: string;
  size: number;
}

export interface ExecOptions {
  stdin?: string | Uint8Array;
  onStdout?: (chunk: Buffer) => void;
  onStderr?: (chunk: Buffer) => void;
  /** The most bytes of stdout and stderr together kept (default MAX_OUTPUT); past it the command is ended and SandboxError thrown. null keeps everything. */
  maxOutput?: number | null;
}

// What the client takes from a sandbox at most. The agent decides how large
// a file is and how much a command prints: a sparse file of terabytes costs
// it nothing, and `yes` prints until the exec API's timeout.
/** The most bytes readFile reads (and list reads of a listing). */
export const MAX_READ = 16 << 20;
/** The most bytes of output exec keeps by default. */
export const MAX_OUTPUT = 16 << 20;

export interface ClaimOptions {
  name?: string;
  namespace?: string;
  /** spec.worktree, e.g. { repository: "/workspace/project", branch: "feature" } */
  worktree?: Record<string, unknown>;
  timeoutMs?: number;
}

export interface ClientOptions {
  kubeconfig?: string;
  context?: string;
  namespace?: string;
  /** "api-server" or "node"; default api-server when the API server serves the aggregated API. */
  via?: "api-server" | "node";
  /** A token issued for the exec API's audience, for a node; a kubeconfig token is never sent to a node. */
  apiToken?: string;
}

/** How to reach one HTTPS server: its base URL, TLS material and headers. */
interface Target {
  base: string;
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  insecure?: boolean;
  /** The name the server's certificate must carry, when not the base URL's host. */
  servername?: string;
  headers: Record<string, string>;
}

interface HTTPResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

function request(t: Target, method: string, path: string, body?: Uint8Array | string, headers: Record<string, string> = {}, limit?: number): Promise<HTTPResponse> {
  const url = new URL(t.base + path);
  return new Promise((resolve, reject) => {
    const req = https.request(url, {
      method, ca: t.ca, cert: t.cert, key: t.key, rejectUnauthorized: !t.insecure, servername: t.servername,
      headers: { ...t.headers, ...headers },
    }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (c: Buffer) => {
        size += c.length;
        if (limit !== undefined && size > limit) {
          req.destroy();
          reject(new SandboxError(`${method} ${url.pathname}: the answer is more than ${limit} bytes`));
          return;
        }
        chunks.push(c);
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    });
    req.on("error", reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

function message(body: Buffer): string {
  try {
    const j = JSON.parse(body.toString());
    if (j && typeof j.message === "string") return j.message;
  } catch { /* not JSON */ }
  return body.toString().trim();
}

function material(inline: string | undefined, file: string | undefined): Buffer | undefined {
  if (inline) return Buffer.from(inline, "base64");
  if (file) return readFileSync(file);
  return undefined;
}

export class SandboxClient {
  readonly namespace: string;
  private nodeCA?: Buffer | null;

  private constructor(private readonly api: Target, namespace: string, private readonly opts: ClientOptions) {
    this.namespace = namespace;
  }

  /** The kubeconfig as kubectl reads it: $KUBECONFIG (its first file) or ~/.kube/config. */
  static fromKubeconfig(opts: ClientOptions = {}): SandboxClient {
    const path = opts.kubeconfig ?? (process.env.KUBECONFIG?.split(":")[0] || join(homedir(), ".kube", "config"));
    const kc = parse(readFileSync(path, "utf8"));
    const ctxName = opts.context ?? kc["current-context"];
    const ctx = (kc.contexts ?? []).find((c: any) => c.name === ctxName)?.context;
    if (!ctx) throw new SandboxError(`kubeconfig ${path}: no context ${ctxName}`);
    const cluster = (kc.clusters ?? []).find((c: any) => c.name === ctx.cluster)?.cluster;
    const user = (kc.users ?? []).find((u: any) => u.name === ctx.user)?.user ?? {};
    if (!cluster) throw new SandboxError(`kubeconfig ${path}: no cluster ${ctx.cluster}`);
    if (user.exec || user["auth-provider"]) {
      throw new SandboxError(`kubeconfig ${path}: user ${ctx.user} authenticates with a plugin, which this client does not run; use a client certificate or a token`);
    }
    const headers: Record<string, string> = {};
    const token = user.token ?? (user.tokenFile ? readFileSync(user.tokenFile, "utf8").trim() : undefined);
    if (token) headers.Authorization = `Bearer ${token}`;
    const api: Target = {
      base: String(cluster.server).replace(/\/$/, ""),
      ca: material(cluster["certificate-authority-data"], cluster["certificate-authority"]),
      cert: material(user["client-certificate-data"], user["client-certificate"]),
      key: material(user["client-key-data"], user["client-key"]),
      insecure: cluster["insecure-skip-tls-verify"] === true,
      headers,
    };
    return new SandboxClient(api, opts.namespace ?? ctx.namespace ?? "default", opts);
  }

  /** A Kubernetes API request; JSON in and out. */
  async kube(method: string, path: string, body?: unknown): Promise<any> {
    const r = await request(this.api, method, path, body === undefined ? undefined : JSON.stringify(body),
      body === undefined ? {} : { "Content-Type": "application/json" });
    if (r.status === 404) {
      const e = new SandboxError(`${method} ${path}: ${message(r.body)}`);
      (e as any).notFound = true;
      throw e;
    }
    if (Math.floor(r.status / 100) !== 2) throw new SandboxError(`${method} ${path}: ${message(r.body)} (${r.status})`);
    return r.body.length ? JSON.parse(r.body.toString()) : undefined;
  }

  /** Creates a SessionClaim of sandbox and waits until it is Ready; on timeout it is released and ClaimNotReady says why. */
  async claim(sandbox: string, opts: ClaimOptions = {}): Promise<Claim> {
    const ns = opts.namespace ?? this.namespace;
    const name = opts.name ?? `${sandbox}-${randomBytes(4).toString("hex")}`;
    const spec: Record<string, unknown> = { sandboxName: sandbox };
    if (opts.worktree) spec.worktree = opts.worktree;
    await this.kube("POST", `/apis/${GROUP}/${VERSION}/namespaces/${encodeURIComponent(ns)}/sessionclaims`, {
      apiVersion: `${GROUP}/${VERSION}`, kind: "SessionClaim", metadata: { name, namespace: ns }, spec,
    });
    const c = new Claim(this, ns, name, true);
    try {
      await c.waitReady(opts.timeoutMs ?? 120_000);
    } catch (e) {
      await c.release();
      throw e;
    }
    return c;
  }

  /** An existing claim; release() is not called for it on disposal. */
  use(name: string, namespace?: string): Claim {
    return new Claim(this, namespace ?? this.namespace, name, false);
  }

  /** Where the claim's exec API is, and how to reach it. */
  async target(claim: Claim): Promise<Target> {
    if (await this.aggregated()) {
      return { ...this.api, base: this.api.base + AGGREGATED_PREFIX };
    }
    const sc = await claim.get();
    const endpoint = sc.status?.endpoint;
    if (!endpoint) throw new SandboxError(`SessionClaim ${claim.namespace}/${claim.name} has no status.endpoint yet`);
    if (!this.opts.apiToken && !this.api.cert) {
      throw new SandboxError("reaching the exec API on the Sandbox's node needs the kubeconfig's client certificate or apiToken; a kubeconfig token is never sent to a node");
    }
    const headers: Record<string, string> = {};
    if (this.opts.apiToken) headers.Authorization = `Bearer ${this.opts.apiToken}`;
    return {
      base: `https://${endpoint}/api/${VERSION}`, ca: (await this.execCA()) ?? this.api.ca,
      cert: this.opts.apiToken ? undefined : this.api.cert, key: this.opts.apiToken ? undefined : this.api.key, headers,
      servername: await this.sandboxNode(claim.namespace, sc.spec?.sandboxName),
    };
  }

  /**
   * The node of a claim's Sandbox, which the node's certificate must name
   * whatever address the claim's endpoint gives: a node's controller writes
   * that endpoint, and a taken one could point it at itself and take the
   * token sent. Undefined (the address is verified) when the Sandbox is on
   * no node or this user may not read it.
   */
  private async sandboxNode(ns: string, sandbox?: string): Promise<string | undefined> {
    if (!sandbox) return undefined;
    try {
      const sb = await this.kube("GET", `/apis/${GROUP}/${VERSION}/namespaces/${encodeURIComponent(ns)}/sandboxes/${encodeURIComponent(sandbox)}`);
      return sb?.spec?.nodeName || sb?.status?.nodeName || undefined;
    } catch {
      return undefined;
    }
  }

  private async aggregated(): Promise<boolean> {
    if (this.opts.via) return this.opts.via === "api-server";
    try {
      await this.kube("GET", AGGREGATED_PREFIX);
      return true;
    } catch {
      return false;
    }
  }

  private async execCA(): Promise<Buffer | undefined> {
    if (this.nodeCA === undefined) {
      try {
        const cm = await this.kube("GET", `/api/v1/namespaces/${SYSTEM_NAMESPACE}/configmaps/${CA_CONFIGMAP}`);
        this.nodeCA = cm?.data?.["ca.crt"] ? Buffer.from(cm.data["ca.crt"]) : null;
      } catch {
        this.nodeCA = null;
      }
    }
    return this.nodeCA ?? undefined;
  }
}

export class Claim {
  constructor(readonly client: SandboxClient, readonly namespace: string, readonly name: string, private readonly owned: boolean) {}

  private get path(): string {
    return `/namespaces/${encodeURIComponent(this.namespace)}/sessionclaims/${encodeURIComponent(this.name)}`;
  }

  get(): Promise<any> {
    return this.client.kube("GET", `/apis/${GROUP}/${VERSION}${this.path}`);
  }

  async waitReady(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      let ready: any;
      try {
        const claim = await this.get();
        const conds: any[] = claim.status?.conditions ?? [];
        ready = conds.find((c) => c.type === "Ready");
        // A claim that asked for a worktree is ready once its worktree is.
        if (ready?.status === "True" && claim.spec?.worktree) ready = conds.find((c) => c.type === "WorktreeReady");
      } catch (e) {
        if (!(e as any).notFound) throw e;
      }
      if (ready?.status === "True") return;
      if (Date.now() >= deadline) {
        throw new ClaimNotReady(`${this.namespace}/${this.name}`, ready?.reason ?? "NoCondition", ready?.message ?? "the controller has not reported on the claim");
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** Deletes the claim and waits until it is gone. */
  async release(timeoutMs = 60_000): Promise<void> {
    try {
      await this.client.kube("DELETE", `/apis/${GROUP}/${VERSION}${this.path}`);
    } catch (e) {
      if ((e as any).notFound) return;
      throw e;
    }
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      try {
        await this.get();
      } catch (e) {
        if ((e as any).notFound) return;
        throw e;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.owned) await this.release();
  }

  /** Runs one command (an argv array, never a shell line); a refused one throws CommandRefused. */
  async exec(argv: string[], opts: ExecOptions = {}): Promise<ExecResult> {
    if (argv.length === 0) throw new SandboxError("argv: give the command and its arguments");
    const t = await this.client.target(this);
    const q = new URLSearchParams();
    for (const a of argv) q.append("command", a);
    q.set("stdout", "true");
    q.set("stderr", "true");
    q.set("stdin", opts.stdin !== undefined ? "true" : "false");
    const url = t.base.replace(/^https:/, "wss:") + this.path + "/exec?" + q.toString();
    // ws hands servername to tls.connect, which checks the certificate for it.
    const tlsOpts: WebSocket.ClientOptions & { servername?: string } = { ca: t.ca, cert: t.cert, key: t.key, rejectUnauthorized: !t.insecure, servername: t.servername, headers: t.headers };
    const ws = new WebSocket(url, [PROTOCOL], tlsOpts);
    const out: Buffer[] = [], err: Buffer[] = [];
    const maxOutput = opts.maxOutput === undefined ? MAX_OUTPUT : opts.maxOutput;
    let kept = 0, tooMuch = false;
    let status: any;
    return await new Promise<ExecResult>((resolve, reject) => {
      ws.on("unexpected-response", (req, res) => {
        // The refusal's body is read up to 64 KiB, and its connection is
        // ended here: ws leaves that to whoever listens for this event,
        // and a connection kept alive keeps the process from exiting. The
        // socket is taken now: once the answer has ended, neither the
        // request nor the answer holds it.
        const socket = req.socket;
        const chunks: Buffer[] = [];
        let size = 0;
        const done = () => {
          socket?.destroy();
          req.destroy();
          reject(new SandboxError(`exec in SessionClaim ${this.namespace}/${this.name}: ${message(Buffer.concat(chunks))} (${res.statusCode})`));
        };
        res.on("data", (c: Buffer) => {
          if (size < 64 << 10) {
            chunks.push(c.subarray(0, (64 << 10) - size));
            size += c.length;
          }
          if (size >= 64 << 10) done();
        });
        res.on("end", done);
        res.on("error", done);
      });
      ws.on("error", (e) => reject(e));
      ws.on("open", () => {
        if (opts.stdin === undefined) return;
        const data = typeof opts.stdin === "string" ? Buffer.from(opts.stdin) : Buffer.from(opts.stdin);
        for (let i = 0; i < data.length; i += 32 << 10) {
          ws.send(Buffer.concat([Buffer.from([STDIN]), data.subarray(i, i + (32 << 10))]));
        }
        ws.send(Buffer.from([CLOSE, STDIN]));
      });
      ws.on("message", (frame: Buffer) => {
        if (frame.length === 0 || tooMuch) return;
        const data = frame.subarray(1);
        if ((frame[0] === STDOUT || frame[0] === STDERR) && maxOutput !== null && (kept += data.length) > maxOutput) {
          tooMuch = true;
          ws.terminate();
          reject(new SandboxError(`exec ${argv[0]} in SessionClaim ${this.namespace}/${this.name}: more than maxOutput=${maxOutput} bytes of output; the command was ended (pass a larger maxOutput, or null to keep it all)`));
          return;
        }
        switch (frame[0]) {
          case STDOUT: out.push(Buffer.from(data)); opts.onStdout?.(Buffer.from(data)); break;
          case STDERR: err.push(Buffer.from(data)); opts.onStderr?.(Buffer.from(data)); break;
          case STATUS: status = JSON.parse(data.toString()); break;
        }
      });
      ws.on("close", () => {
        try {
          resolve({ exitCode: exitCode(status), stdout: Buffer.concat(out), stderr: Buffer.concat(err) });
        } catch (e) {
          reject(e);
        }
      });
    });
  }

  private async files(method: string, path: string, body?: Uint8Array | string, query = ""): Promise<HTTPResponse> {
    const parts = path.split("/").filter((p) => p);
    if (parts.length === 0 || !AREAS.includes(parts[0])) {
      throw new SandboxError(`${path}: a sandbox path begins with one of the areas: /${AREAS.join(", /")}`);
    }
    const t = await this.client.target(this);
    const r = await request(t, method, this.path + "/files/" + parts.map(encodeURIComponent).join("/") + query, body, {}, MAX_READ);
    if (Math.floor(r.status / 100) !== 2) {
      throw new SandboxError(`${method} ${path} in SessionClaim ${this.namespace}/${this.name}: ${message(r.body)} (${r.status})`);
    }
    return r;
  }

  /** A file's bytes, at most MAX_READ of them. */
  async readFile(path: string): Promise<Buffer> {
    const r = await this.files("GET", path);
    // The agent may have put a directory where the file was.
    const kind = r.headers["x-entry-type"];
    if (kind !== "file") throw new SandboxError(`reading ${path}: it is a ${kind ?? "thing the server did not name"}, not a regular file`);
    return r.body;
  }

  async writeFile(path: string, data: string | Uint8Array): Promise<void> {
    await this.files("PUT", path, data);
  }

  async list(path = "/workspace"): Promise<Entry[]> {
    const r = await this.files("GET", path);
    if (r.headers["x-entry-type"] !== "dir") throw new SandboxError(`${path} is not a directory`);
    return (JSON.parse(r.body.toString()) as any[]).map((e) => ({ name: e.name, type: e.type, size: e.size ?? 0 }));
  }

  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.files("DELETE", path, undefined, opts.recursive ? "?recursive=true" : "");
  }
}

function exitCode(status: any): number {
  if (!status) throw new SandboxError("the exec API closed the stream without the command's status");
  if (status.status === "Success") return 0;
  for (const c of status.details?.causes ?? []) {
    if (c.reason === "ExitCode") return Number(c.message);
  }
  if (status.reason === "CommandRefused") throw new CommandRefused(status.message ?? "refused");
  throw new SandboxError(status.message ?? JSON.stringify(status));
}
