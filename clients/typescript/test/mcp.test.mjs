// The MCP server driven by the official TypeScript SDK's client, over
// stdio (sandboxctl mcp, SANDBOXCTL and SANDBOXCTL_CONFIG) and over
// streamable HTTP (a claim's endpoint of the exec API, with the
// kubeconfig's client certificate).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as https from "node:https";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { SandboxClient } from "../dist/index.js";

const kubeconfig = process.env.SANDBOX_KUBECONFIG;
const namespace = process.env.SANDBOX_NAMESPACE ?? "default";
const sandbox = process.env.SANDBOX_NAME ?? "typescript";
const sandboxctl = process.env.SANDBOXCTL;

async function exercise(client, { refusedHas }) {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  assert.deepEqual(names, ["exec", "list_directory", "read_file", "remove", "write_file"]);
  const exec = tools.find((t) => t.name === "exec");
  assert.match(exec.description, /Allowed commands: cat, mkdir, sh/);
  assert.match(exec.description, /\/workspace \(rw\)/);

  let r = await client.callTool({ name: "exec", arguments: { argv: ["sh", "-c", "echo hi; exit 2"] } });
  assert.ok(!r.isError, JSON.stringify(r));
  assert.equal(r.structuredContent.exit_code, 2);
  assert.equal(r.structuredContent.stdout, "hi\n");

  r = await client.callTool({ name: "exec", arguments: { argv: ["curl", "http://example.com"] } });
  assert.ok(r.isError, "a command outside the allowlist is a tool error");
  assert.match(r.content.map((c) => c.text).join("\n"), refusedHas);

  r = await client.callTool({ name: "write_file", arguments: { path: "/workspace/mcp-ts/a.txt", content: "via mcp\n" } });
  assert.ok(!r.isError, JSON.stringify(r));
  r = await client.callTool({ name: "read_file", arguments: { path: "/workspace/mcp-ts/a.txt" } });
  assert.equal(r.structuredContent.content, "via mcp\n");
  r = await client.callTool({ name: "write_file", arguments: { path: "/blocks/x", content: "x" } });
  assert.ok(r.isError, "a read-only area refuses a write");
  r = await client.callTool({ name: "remove", arguments: { path: "/workspace/mcp-ts", recursive: true } });
  assert.ok(!r.isError, JSON.stringify(r));
}

test("over stdio: sandboxctl mcp", { skip: !sandboxctl && "run through test/e2e/clients" }, async () => {
  const transport = new StdioClientTransport({
    command: sandboxctl,
    args: ["mcp", "--config", process.env.SANDBOXCTL_CONFIG, "--agent", "mcp-ts", "--areas-root", process.env.SANDBOXCTL_AREAS],
    stderr: "inherit",
  });
  const client = new Client({ name: "ts-harness", version: "0" });
  await client.connect(transport);
  try {
    await exercise(client, { refusedHas: /refused.*curl|curl.*refused/ });
  } finally {
    await client.close();
  }
});

// fetchWith is a fetch over node:https, for TLS client certificates.
function fetchWith(tls) {
  return (url, init = {}) => new Promise((resolve, reject) => {
    const headers = {};
    new Headers(init.headers ?? {}).forEach((v, k) => { headers[k] = v; });
    const req = https.request(new URL(url), { method: init.method ?? "GET", headers, ...tls }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) h.set(k, Array.isArray(v) ? v.join(", ") : v);
        const status = res.statusCode ?? 0;
        const body = [204, 304].includes(status) ? null : Buffer.concat(chunks);
        resolve(new Response(body, { status, headers: h }));
      });
    });
    req.on("error", reject);
    if (init.body) req.write(init.body);
    req.end();
  });
}

test("over streamable HTTP: a claim's endpoint of the exec API", { skip: !kubeconfig && "run through test/e2e/clients" }, async () => {
  const sc = SandboxClient.fromKubeconfig({ kubeconfig, namespace, via: "node" });
  const claim = await sc.claim(sandbox, { timeoutMs: 120_000 });
  try {
    const t = await sc.target(claim);
    const url = new URL(`${t.base}/namespaces/${namespace}/sessionclaims/${claim.name}/mcp`);
    const client = new Client({ name: "ts-harness", version: "0" });
    await client.connect(new StreamableHTTPClientTransport(url, { fetch: fetchWith({ ca: t.ca, cert: t.cert, key: t.key }) }));
    try {
      await exercise(client, { refusedHas: /refused.*curl|curl.*refused/ });
    } finally {
      await client.close();
    }
    // Without the client certificate, the endpoint refuses.
    const anonymous = new Client({ name: "ts-harness", version: "0" });
    await assert.rejects(anonymous.connect(new StreamableHTTPClientTransport(url, { fetch: fetchWith({ ca: t.ca }) })));
  } finally {
    await claim.release();
  }
});
