// The real client (@kubernetes/client-node) against a stand-in API server
// on loopback, driven through test/e2e-run.mjs as clipjob's Go e2e drives
// it: a kubeconfig file, the relay's URL and token file, JSON lines out.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";

import { KubeConfigError, loadKubeConfig } from "../src/kube.js";
import { FakeRelay } from "./fake-relay.js";

/** Enough of kube-apiserver for a run: Secrets and Jobs in one namespace, and a 409 on demand. */
class FakeApiServer {
  readonly objects = new Map<string, Record<string, unknown>>();
  readonly requests: string[] = [];
  refuseJobsWith: { code: number; status: Record<string, unknown> } | null = null;
  onJobCreated: (job: Record<string, unknown>) => void = () => {};
  private server!: http.Server;
  url = "";

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }

  /** The kubeconfig's directory, removed on close. */
  private dir = "";

  kubeconfig(): string {
    const dir = mkdtempSync(join(tmpdir(), "clipjob-kubeconfig-"));
    this.dir = dir;
    const file = join(dir, "kubeconfig");
    writeFileSync(
      file,
      JSON.stringify({
        apiVersion: "v1",
        kind: "Config",
        // client-node refuses plain HTTP unless TLS verification is off.
        clusters: [{ name: "fake", cluster: { server: this.url, "insecure-skip-tls-verify": true } }],
        users: [{ name: "paperclip", user: { token: "server-token" } }],
        contexts: [{ name: "fake", context: { cluster: "fake", user: "paperclip" } }],
        "current-context": "fake",
      }),
    );
    return file;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let body = "";
    for await (const chunk of req) body += chunk;
    const url = new URL(req.url ?? "/", this.url);
    this.requests.push(`${req.method} ${url.pathname}`);
    const send = (code: number, obj: unknown): void => void res.writeHead(code, { "Content-Type": "application/json" }).end(JSON.stringify(obj));
    const notFound = (name: string) => send(404, { kind: "Status", apiVersion: "v1", status: "Failure", reason: "NotFound", code: 404, message: `"${name}" not found` });
    const m = /^\/(?:api\/v1|apis\/batch\/v1)\/namespaces\/([^/]+)\/(secrets|jobs)(?:\/([^/]+))?$/.exec(url.pathname);
    if (!m) return send(404, { kind: "Status", code: 404, reason: "NotFound", message: "no route" });
    const [, , kind, name] = m;
    if (req.method === "POST") {
      const obj = JSON.parse(body) as { metadata: { name: string; uid?: string } };
      obj.metadata.uid = randomUUID(); // as the API server does
      if (kind === "jobs" && this.refuseJobsWith) {
        return send(this.refuseJobsWith.code, { kind: "Status", apiVersion: "v1", status: "Failure", code: this.refuseJobsWith.code, ...this.refuseJobsWith.status });
      }
      this.objects.set(`${kind}/${obj.metadata.name}`, obj);
      send(201, obj);
      if (kind === "jobs") this.onJobCreated(obj);
      return;
    }
    const key = `${kind}/${name}`;
    if (req.method === "GET" && !name) {
      const items = [...this.objects.entries()].filter(([k]) => k.startsWith(`${kind}/`)).map(([, v]) => v);
      return send(200, { kind: kind === "jobs" ? "JobList" : "SecretList", apiVersion: "v1", metadata: {}, items });
    }
    if (req.method === "GET") return this.objects.has(key) ? send(200, this.objects.get(key)) : notFound(name);
    if (req.method === "DELETE") {
      if (!this.objects.delete(key)) return notFound(name);
      return send(200, { kind: "Status", apiVersion: "v1", status: "Success" });
    }
    send(405, { kind: "Status", code: 405, message: "method not allowed" });
  }
}

const script = fileURLToPath(new URL("../../test/e2e-run.mjs", import.meta.url));

/**
 * Runs the script and gives what it printed. cancelWhen, when given, is
 * asked of each object it prints; the first time it holds, the run is
 * cancelled (stdin closed, with spec.cancelOnStdinEnd), as a Paperclip
 * user cancels a run they watch: after what they saw, not on a clock.
 */
function runScript(spec: Record<string, unknown>, cancelWhen?: (out: Record<string, unknown>) => boolean): Promise<Array<Record<string, unknown>>> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, JSON.stringify(spec)], { timeout: 60_000 });
    const out: Array<Record<string, unknown>> = [];
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (d: string) => void (stderr += d));
    createInterface({ input: child.stdout }).on("line", (l) => {
      if (!l) return;
      const o = JSON.parse(l) as Record<string, unknown>;
      out.push(o);
      if (cancelWhen?.(o)) child.stdin.end();
    });
    child.stdin.on("error", () => {}); // closed after the script exited: nothing to cancel
    child.on("error", reject);
    child.on("close", (code, signal) => {
      if (code !== 0) return reject(new Error(`e2e-run.mjs exited ${code ?? signal}\n${stderr}`));
      resolve(out);
    });
  });
}

describe("e2e-run.mjs against a stand-in API server and relay", () => {
  let api: FakeApiServer;
  let relay: FakeRelay;
  let base: Record<string, unknown>;

  before(async () => {
    api = await new FakeApiServer().start();
    relay = await new FakeRelay().start();
    base = { kubeconfig: api.kubeconfig(), namespace: "paperclip", relayUrl: relay.url, relayTokenFile: relay.tokenFile(), prompt: "Fix the failing test." };
  });
  after(async () => {
    await api.close();
    await relay.close();
  });

  it("runs a Job to its result, printing each line once", async () => {
    api.onJobCreated = (job) => {
      const labels = (job.metadata as { labels: Record<string, string> }).labels;
      const meta = job.metadata as { name: string; uid: string };
      relay.addRun({ id: labels["paperclip.io/run-id"], agent: labels["paperclip.io/agent-id"], job: meta.name, jobUid: meta.uid });
      relay.appendLines(labels["paperclip.io/run-id"], "line 1", "line 2");
      relay.finish(labels["paperclip.io/run-id"], { phase: "Succeeded", exitCode: 0, result: { outcome: "succeeded", text: "done", sessionId: "s-1" } });
    };
    const out = await runScript({ ...base, agentId: "agent-e2e", runId: "run-e2e-1" });
    const stdout = out.filter((o) => o.stream === "stdout").map((o) => o.line);
    assert.deepEqual(stdout, ["line 1", "line 2"]);
    assert.ok(out.some((o) => o.meta));
    const last = out[out.length - 1].result as Record<string, unknown>;
    assert.equal(last.errorCode, null);
    assert.equal(last.summary, "done");
    assert.equal(last.sessionId, "s-1");
    assert.ok(api.requests.includes("POST /api/v1/namespaces/paperclip/secrets"));
    assert.ok(api.requests.includes("POST /apis/batch/v1/namespaces/paperclip/jobs"));
  });

  it("a 409 from clipjob through the real client: blocked, the Secret removed", async () => {
    api.refuseJobsWith = {
      code: 409,
      status: {
        reason: "Conflict",
        message: 'admission webhook "vjob.clipjob.paperclip.io" denied the request: agent agent-busy has an active run',
        details: { causes: [{ reason: "clipjob.paperclip.io/agent-busy", message: "busy" }, { reason: "clipjob.paperclip.io/holder-run-id", message: "run-0" }] },
      },
    };
    try {
      const out = await runScript({ ...base, agentId: "agent-busy", runId: "run-e2e-2" });
      const result = out[out.length - 1].result as Record<string, unknown>;
      assert.equal(result.errorCode, "k8s_concurrent_run_blocked");
      assert.equal((result.errorMeta as Record<string, unknown>).holderRunId, "run-0");
      assert.ok(api.requests.some((r) => r.startsWith("DELETE /api/v1/namespaces/paperclip/secrets/")), api.requests.join("\n"));
    } finally {
      api.refuseJobsWith = null;
    }
  });

  it("cancels: deletes the Job", async () => {
    api.onJobCreated = (job) => {
      const labels = (job.metadata as { labels: Record<string, string> }).labels;
      const meta = job.metadata as { name: string; uid: string };
      relay.addRun({ id: labels["paperclip.io/run-id"], agent: labels["paperclip.io/agent-id"], job: meta.name, jobUid: meta.uid });
      relay.appendLines(labels["paperclip.io/run-id"], "started");
    };
    // Cancelled once its first line came through: the Job exists then, whatever this machine's speed.
    const out = await runScript({ ...base, agentId: "agent-cancel", runId: "run-e2e-3", cancelOnStdinEnd: true }, (o) => o.stream === "stdout");
    const result = out[out.length - 1].result as Record<string, unknown>;
    assert.equal(result.errorCode, "cancelled");
    assert.ok(api.requests.some((r) => /^DELETE \/apis\/batch\/v1\/namespaces\/paperclip\/jobs\//.test(r)));
    assert.deepEqual(
      out.filter((o) => o.stream === "stdout").map((o) => o.line),
      ["started"],
    );
  });
});

describe("loadKubeConfig", () => {
  const dir = mkdtempSync(join(tmpdir(), "clipjob-kubeconfig-load-"));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const kubeconfig = (user: string) =>
    [
      "apiVersion: v1",
      "kind: Config",
      "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]",
      "contexts: [{name: x, context: {cluster: c, user: u}}]",
      "current-context: x",
      "users:",
      "- name: u",
      "  user:",
      ...user.split("\n").map((l) => `    ${l}`),
      "",
    ].join("\n");
  const write = (name: string, text: string) => {
    const f = join(dir, name);
    writeFileSync(f, text);
    return f;
  };

  it("with nothing configured, names CLIPJOB_KUBECONFIG instead of talking to localhost:8080", () => {
    assert.throws(
      () => loadKubeConfig("", { HOME: join(dir, "no-home") }),
      (err: Error) => err instanceof KubeConfigError && /CLIPJOB_KUBECONFIG is not set/.test(err.message) && /Set CLIPJOB_KUBECONFIG/.test(err.message),
    );
    assert.throws(() => loadKubeConfig("", { HOME: dir, KUBECONFIG: join(dir, "missing") }), /KUBECONFIG \(.*missing\) names no file that exists/);
    assert.throws(() => loadKubeConfig(join(dir, "nope"), {}), /CLIPJOB_KUBECONFIG names .*nope, which does not exist/);
  });

  it("refuses a user whose token is under tokenFile (the key is token-file): it would connect as anonymous", () => {
    const f = write("camel", kubeconfig("tokenFile: /var/run/secrets/token"));
    assert.throws(() => loadKubeConfig(f, {}), (err: Error) => err instanceof KubeConfigError && /would connect as anonymous/.test(err.message) && /tokenFile \(the key is token-file\)/.test(err.message));
    assert.throws(() => loadKubeConfig(write("none", kubeconfig("{}")), {}), /carries no credentials/);
    for (const spelling of ["token_file", "tokenfile", "TokenFile"]) {
      assert.throws(() => loadKubeConfig(write(spelling, kubeconfig(`${spelling}: /var/run/secrets/token`)), {}), new RegExp(`${spelling} \\(the key is token-file\\)`));
    }
  });

  it("refuses half a credential: it sends nothing (hostile review)", () => {
    for (const user of [
      "username: admin",
      "client-certificate-data: Zm9v",
      "client-key-data: YmFy",
      "exec: {apiVersion: client.authentication.k8s.io/v1}",
      "auth-provider: {config: {}}",
    ]) {
      assert.throws(() => loadKubeConfig(write("half", kubeconfig(user)), {}), /carries no credentials/, user);
    }
    assert.equal(loadKubeConfig(write("basic", kubeconfig("username: admin\npassword: pw")), {}).getCurrentUser()?.username, "admin");
  });

  it("takes a token, a token-file, a client certificate or exec", () => {
    const tokenFile = write("token", "abc");
    for (const user of ["token: abc", `token-file: ${tokenFile}`, "client-certificate-data: Zm9v\nclient-key-data: YmFy", "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/true}"]) {
      const kc = loadKubeConfig(write("ok", kubeconfig(user)), {});
      assert.equal(kc.getCurrentCluster()?.server, "https://127.0.0.1:6443", user);
    }
    assert.equal(loadKubeConfig("", { KUBECONFIG: write("env", kubeconfig("token: abc")) }).getCurrentUser()?.token, "abc");
  });

  it("refuses a context with no cluster server", () => {
    const f = write("noserver", kubeconfig("token: abc").replace("server: 'https://127.0.0.1:6443'", "insecure-skip-tls-verify: true"));
    assert.throws(() => loadKubeConfig(f, {}), (err: Error) => err instanceof KubeConfigError && /^CLIPJOB_KUBECONFIG \(.*\): .*server is missing/.test(err.message));
  });
});
