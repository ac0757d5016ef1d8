// An agent loop in a few lines: claim a sandbox with a git worktree of its
// own, look around, edit a file in the worktree, show the diff.
//
//   node agent-loop.mjs SANDBOX REPOSITORY [NAMESPACE]
//
// (after `npm ci && npm run build` in clients/typescript)
import { SandboxClient, CommandRefused } from "../../clients/typescript/dist/index.js";

const [sandbox, repository, namespace] = process.argv.slice(2);
const client = SandboxClient.fromKubeconfig({ namespace });
const claim = await client.claim(sandbox, { worktree: { repository, createBranch: true } });
try {
  const wt = (await claim.get()).status.worktree.path;
  console.log(`worktree ${wt}`);
  for (const argv of [["git", "-C", wt, "status", "--short", "--branch"], ["git", "-C", wt, "log", "--oneline", "-1"]]) {
    const r = await claim.exec(argv);
    process.stdout.write(`$ ${argv.join(" ")}  (exit ${r.exitCode})\n${r.stdout}${r.stderr}`);
  }
  await claim.writeFile(`${wt}/NOTES.md`, "# Notes\n\nWritten by the agent.\n");
  await claim.exec(["git", "-C", wt, "add", "--intent-to-add", "NOTES.md"]);
  process.stdout.write((await claim.exec(["git", "-C", wt, "diff"])).stdout);
  try {
    await claim.exec(["curl", "https://example.com"]);
  } catch (e) {
    if (!(e instanceof CommandRefused)) throw e;
    console.log(`refused, as it should be: ${e.message}`);
  }
} finally {
  await claim.release();
}
