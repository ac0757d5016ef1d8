// Against a running control plane and controller (make run's): the Go
// harness test/e2e/clients starts them, makes a Sandbox, builds this
// package and runs this with SANDBOX_KUBECONFIG, SANDBOX_NAMESPACE and
// SANDBOX_NAME set.
import { test } from "node:test";
import assert from "node:assert/strict";
import { SandboxClient, ClaimNotReady, CommandRefused, SandboxError } from "../dist/index.js";

const kubeconfig = process.env.SANDBOX_KUBECONFIG;
const namespace = process.env.SANDBOX_NAMESPACE ?? "default";
const sandbox = process.env.SANDBOX_NAME ?? "typescript";

test("claim, exec, files, release", { skip: !kubeconfig && "run through test/e2e/clients" }, async () => {
  const client = SandboxClient.fromKubeconfig({ kubeconfig, namespace });
  const claim = await client.claim(sandbox, { timeoutMs: 120_000 });
  try {
    let r = await claim.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert.deepEqual([r.exitCode, r.stdout.toString(), r.stderr.toString()], [3, "out\n", "err\n"]);

    const streamed = [];
    r = await claim.exec(["cat"], { stdin: "through stdin\n", onStdout: (b) => streamed.push(b) });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout.toString(), "through stdin\n");
    assert.equal(Buffer.concat(streamed).toString(), "through stdin\n");

    await claim.exec(["mkdir", "-p", "/workspace/ts"]);
    await claim.writeFile("/workspace/ts/notes.txt", "from typescript\n");
    assert.equal((await claim.readFile("/workspace/ts/notes.txt")).toString(), "from typescript\n");
    assert.equal((await claim.exec(["cat", "/workspace/ts/notes.txt"])).stdout.toString(), "from typescript\n");
    assert.deepEqual((await claim.list("/workspace/ts")).map((e) => e.name), ["notes.txt"]);
    await claim.remove("/workspace/ts", { recursive: true });
    await assert.rejects(claim.readFile("/workspace/ts/notes.txt"), SandboxError);

    await assert.rejects(claim.exec(["curl", "http://example.com"]), (e) => e instanceof CommandRefused && /curl/.test(e.message));
    await assert.rejects(claim.writeFile("/blocks/x", "read-only"), SandboxError);
  } finally {
    await claim[Symbol.asyncDispose]();
  }
  await assert.rejects(client.use(claim.name).get(), SandboxError);
});

test("a claim of a missing Sandbox says why", { skip: !kubeconfig && "run through test/e2e/clients" }, async () => {
  const client = SandboxClient.fromKubeconfig({ kubeconfig, namespace });
  await assert.rejects(client.claim("no-such-sandbox", { timeoutMs: 3000 }),
    (e) => e instanceof ClaimNotReady && ["SandboxNotFound", "NoCondition"].includes(e.reason));
});

test("what the agent sizes is bounded", { skip: !kubeconfig && "run through test/e2e/clients" }, async () => {
  const client = SandboxClient.fromKubeconfig({ kubeconfig, namespace });
  const claim = await client.claim(sandbox, { timeoutMs: 120_000 });
  try {
    // A sparse file one byte past the bound costs the agent nothing.
    const r = await claim.exec(["sh", "-c", "mkdir -p /workspace/big && truncate -s 16777217 /workspace/big/file"]);
    assert.equal(r.exitCode, 0, r.stderr.toString());
    await assert.rejects(claim.readFile("/workspace/big/file"), (e) => e instanceof SandboxError && /more than/.test(e.message));
    // A directory where a file was is not read as the file.
    await assert.rejects(claim.readFile("/workspace/big"), (e) => e instanceof SandboxError && /not a regular file/.test(e.message));
    // Output past maxOutput ends the command.
    await assert.rejects(claim.exec(["sh", "-c", "while :; do echo 0123456789abcdef0123456789abcdef; done"], { maxOutput: 1 << 20 }),
      (e) => e instanceof SandboxError && /maxOutput/.test(e.message));
    assert.equal((await claim.exec(["sh", "-c", "echo small"], { maxOutput: 16 })).stdout.toString(), "small\n");
    await claim.remove("/workspace/big", { recursive: true });
  } finally {
    await claim[Symbol.asyncDispose]();
  }
});
