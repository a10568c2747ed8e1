import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { linkSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";

import { DEFAULT_RELAY_TOKEN_FILE, DEFAULT_RELAY_URL, defaultNamespace, parseEnv, resolveSettings, SettingsError } from "../src/config.js";
import { mountedRunDirs } from "../src/rundirs.js";
import { podEnv } from "../src/podenv.js";
import { buildPrompt, buildRunEnv, readInstructionsFile, rootsFor, sessionToResume } from "../src/prompt.js";

const agent = { id: "agent-1", companyId: "company-1", name: "Coder", adapterType: "claude_k8s", adapterConfig: {} };

describe("settings", () => {
  it("defaults", () => {
    const s = resolveSettings({}, { profile: "claude_local" }, () => {}, { POD_NAMESPACE: "paperclip" });
    assert.equal(s.namespace, "paperclip");
    assert.equal(s.profile, "claude_local");
    assert.equal(s.relayUrl, DEFAULT_RELAY_URL);
    assert.equal(s.relayTokenFile, DEFAULT_RELAY_TOKEN_FILE);
    assert.equal(s.reattach, true);
    assert.equal(s.deletePropagation, "Foreground");
    assert.equal(s.promptAnnotationMaxBytes, 64 * 1024);
  });

  it("reads every key, numbers and booleans given as strings too", () => {
    const s = resolveSettings(
      { namespace: "agents", profile: "my_profile", maxTurnsPerRun: "5", reattach: "false", deletePropagation: "Background", timeoutSec: 60 },
      { profile: "claude_local" },
      () => {},
      { CLIPJOB_NAMESPACE: "paperclip", CLIPJOB_NAMESPACES: "agents, more", CLIPJOB_PROFILES: "my_profile", CLIPJOB_RELAY_URL: "https://relay:8090/" },
    );
    assert.equal(s.namespace, "agents");
    assert.equal(s.profile, "my_profile");
    assert.equal(s.relayUrl, "https://relay:8090");
    assert.equal(s.maxTurnsPerRun, 5);
    assert.equal(s.reattach, false);
    assert.equal(s.deletePropagation, "Background");
    assert.equal(s.timeoutSec, 60);
  });

  // Hostile review: an agent's config could send the server's relay token
  // to any URL, and create Jobs in any namespace the server may write.
  it("where the server's credentials go is the server's environment, never the agent's config", () => {
    const warnings: string[] = [];
    const env = {
      CLIPJOB_NAMESPACE: "paperclip",
      CLIPJOB_RELAY_URL: "https://clipjob-relay.clipjob-system.svc",
      CLIPJOB_RELAY_TOKEN_FILE: "/var/run/secrets/clipjob-relay/token",
      CLIPJOB_KUBECONFIG: "",
    };
    const s = resolveSettings(
      {
        relayUrl: "http://attacker.example:80",
        relayTokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token",
        relayCaFile: "/etc/evil-ca.pem",
        kubeconfig: "/tmp/attacker-kubeconfig",
      },
      { profile: "claude_local" },
      (w) => warnings.push(w),
      env,
    );
    assert.equal(s.relayUrl, env.CLIPJOB_RELAY_URL);
    assert.equal(s.relayTokenFile, env.CLIPJOB_RELAY_TOKEN_FILE);
    assert.equal(s.relayCaFile, "");
    assert.equal(s.kubeconfig, "");
    assert.equal(warnings.length, 4);
    assert.match(warnings.join("\n"), /the agent's relayUrl is ignored: .*CLIPJOB_RELAY_URL/);

    assert.throws(
      () => resolveSettings({ namespace: "kube-system" }, { profile: "claude_local" }, () => {}, env),
      (err: unknown) => err instanceof SettingsError && /namespace "kube-system" is not one this server runs agents in \(paperclip\).*CLIPJOB_NAMESPACES/.test(err.message),
    );
    // A profile is the operator's sandbox: only the adapter type's own, or one the operator lists.
    assert.throws(
      () => resolveSettings({ profile: "unsandboxed" }, { profile: "claude_local" }, () => {}, env),
      (err: unknown) => err instanceof SettingsError && /profile "unsandboxed" is not one this server lets agents pick \(claude_local\).*CLIPJOB_PROFILES/.test(err.message),
    );
    assert.equal(resolveSettings({ profile: "claude_local" }, { profile: "claude_local" }, () => {}, env).profile, "claude_local");
    for (const url of ["http://relay.clipjob-system.svc", "ftp://relay", "https://user:pw@relay", "https://relay?x=1", "https://relay#f", "http://[::2]:8090", "not a url"]) {
      assert.throws(() => resolveSettings({}, { profile: "claude_local" }, () => {}, { ...env, CLIPJOB_RELAY_URL: url }), SettingsError, url);
    }
    // Plain http only to this host (a local port-forward).
    for (const url of ["http://127.0.0.1:8090", "http://localhost:8090", "http://[::1]:8090"]) {
      assert.equal(resolveSettings({}, { profile: "claude_local" }, () => {}, { ...env, CLIPJOB_RELAY_URL: url }).relayUrl, url);
    }
    assert.throws(() => resolveSettings({}, { profile: "claude_local" }, () => {}, { ...env, CLIPJOB_INSTRUCTIONS_ROOTS: "relative/dir" }), /not an absolute path/);
  });

  it("the namespace: PAPERCLIP_NAMESPACE, POD_NAMESPACE, the ServiceAccount's, default", () => {
    assert.equal(defaultNamespace({ PAPERCLIP_NAMESPACE: "a", POD_NAMESPACE: "b" }, () => "c"), "a");
    assert.equal(defaultNamespace({ POD_NAMESPACE: "b" }, () => "c"), "b");
    assert.equal(defaultNamespace({}, () => "c"), "c");
    assert.equal(defaultNamespace({}, () => ""), "default");
  });

  // Hostile review: in the env Secret these would fill in for a run option
  // the Job does not name, past clipjob's checks and the adapter's.
  it("env: names clipjob sets from the run are left out", () => {
    const warnings: string[] = [];
    const env = parseEnv({ PAPERCLIP_SESSION_ID: "another-agents-session", PAPERCLIP_MAX_TURNS: "999999", PAPERCLIP_MODEL: "--x", HOME: "/", OK: "1" }, (w) => warnings.push(w));
    assert.deepEqual(env, { OK: "1" });
    assert.equal(warnings.length, 4);
    assert.match(warnings[0], /PAPERCLIP_SESSION_ID is clipjob's to set from the run/);
  });

  it("env: strings and plain bindings; others reported", () => {
    const warnings: string[] = [];
    const env = parseEnv({ A: "1", B: { type: "plain", value: "2" }, C: { type: "secret_ref", secretId: "x" }, "bad name": "3" }, (w) => warnings.push(w));
    assert.deepEqual(env, { A: "1", B: "2" });
    assert.equal(warnings.length, 2);
  });
});

describe("run env", () => {
  it("carries the callback token, the wake and the workspace; config env wins, but not over an explicit key", () => {
    const { env } = buildRunEnv(
      {
        authToken: "tok",
        context: {
          taskId: "task-1",
          wakeReason: "issue_assigned",
          commentId: "c-1",
          issueIds: ["i-1", "i-2"],
          paperclipWorkspace: { cwd: "/paperclip/wt", repoUrl: "https://example.invalid/r.git" },
        },
      },
      { env: { EXTRA: "x" }, paperclipApiUrl: "http://paperclip.paperclip.svc:3100", serverApiUrl: "" },
    );
    assert.equal(env.PAPERCLIP_API_KEY, "tok");
    assert.equal(env.PAPERCLIP_TASK_ID, "task-1");
    assert.equal(env.PAPERCLIP_WAKE_REASON, "issue_assigned");
    assert.equal(env.PAPERCLIP_WAKE_COMMENT_ID, "c-1");
    assert.equal(env.PAPERCLIP_LINKED_ISSUE_IDS, "i-1,i-2");
    assert.equal(env.PAPERCLIP_WORKSPACE_CWD, "/paperclip/wt");
    assert.equal(env.PAPERCLIP_API_URL, "http://paperclip.paperclip.svc:3100");
    assert.equal(env.EXTRA, "x");
    assert.equal(buildRunEnv({ authToken: "tok", context: {} }, { env: { PAPERCLIP_API_KEY: "own" }, paperclipApiUrl: "", serverApiUrl: "" }).env.PAPERCLIP_API_KEY, "own");
  });
});

describe("prompt", () => {
  const settings = { instructionsFilePath: "", instructionsRoots: ["/paperclip"], promptTemplate: "You are {{agent.name}} on run {{runId}}.", bootstrapPromptTemplate: "" };

  it("renders Paperclip's template with the run's data", async () => {
    const p = await buildPrompt({ agent, runId: "run-9", context: {} }, settings, false);
    assert.equal(p.prompt, "You are Coder on run run-9.");
    assert.equal(p.metrics.promptChars, p.prompt.length);
  });

  it("prepends the instructions file, read on the server", async () => {
    const p = await buildPrompt(
      { agent, runId: "run-9", context: {} },
      { ...settings, instructionsFilePath: "/paperclip/agents/a/AGENTS.md" },
      false,
      async () => "Be careful.",
    );
    assert.match(p.prompt, /^Be careful\.\n\nThe above agent instructions were loaded from \/paperclip\/agents\/a\/AGENTS\.md/);
    assert.match(p.prompt, /You are Coder/);
  });

  it("an unreadable instructions file is a note, not a failure", async () => {
    const p = await buildPrompt({ agent, runId: "r", context: {} }, { ...settings, instructionsFilePath: "/nope" }, false, async () => {
      throw new Error("ENOENT");
    });
    assert.equal(p.notes.length, 1);
    assert.equal(p.prompt, "You are Coder on run r.");
  });

  it("bootstrap only for a new session", async () => {
    const s = { ...settings, bootstrapPromptTemplate: "First time, {{agent.name}}." };
    assert.match((await buildPrompt({ agent, runId: "r", context: {} }, s, false)).prompt, /^First time, Coder\./);
    assert.doesNotMatch((await buildPrompt({ agent, runId: "r", context: {} }, s, true)).prompt, /First time/);
  });
});

describe("session to resume", () => {
  const runtime = (sessionParams: Record<string, unknown> | null, sessionId: string | null = null) => ({ sessionId, sessionParams, sessionDisplayId: null, taskKey: null });
  it("the stored session, in the same directory only", () => {
    assert.equal(sessionToResume(runtime({ sessionId: "s1", cwd: "/paperclip/a" }), "/paperclip/a/"), "s1");
    assert.equal(sessionToResume(runtime({ sessionId: "s1", cwd: "/paperclip/a" }), "/paperclip/b"), "");
    assert.equal(sessionToResume(runtime({ sessionId: "s1" }), "/paperclip/b"), "s1");
    assert.equal(sessionToResume(runtime(null, "legacy"), ""), "legacy");
    assert.equal(sessionToResume(runtime(null), ""), "");
  });
});

// Hostile review: instructionsFilePath comes from the agent's config and
// its text goes into a pod annotation anyone who reads Jobs sees;
// /proc/self/environ put the server's env (its database URL) there.
describe("instructions file", () => {
  const root = mkdtempSync(join(tmpdir(), "clipjob-instructions-"));
  const outside = mkdtempSync(join(tmpdir(), "clipjob-outside-"));
  after(() => {
    rmSync(root, { recursive: true, force: true });
    rmSync(outside, { recursive: true, force: true });
  });
  mkdirSync(join(root, "agents"));
  writeFileSync(join(root, "agents", "AGENTS.md"), "Be careful.");
  writeFileSync(join(outside, "secret.txt"), "DATABASE_URL=postgres://server");
  // Paperclip's home as a root: the server's own files sit beside the
  // instructions (instances/<id>/.env, secrets/master.key, config.json).
  mkdirSync(join(root, "instances", "default", "secrets"), { recursive: true });
  writeFileSync(join(root, "instances", "default", ".env"), "PAPERCLIP_AGENT_JWT_SECRET=s3cr3t");
  writeFileSync(join(root, "instances", "default", "secrets", "master.key"), "bWFzdGVy");
  writeFileSync(join(root, "instances", "default", "secrets", "notes.md"), "still a secret");
  writeFileSync(join(root, "instances", "default", "config.json"), "{}");
  symlinkSync(join(root, "instances", "default", ".env"), join(root, "agents", "planted.md"));
  symlinkSync("/proc/self/environ", join(root, "agents", "environ.md"));
  symlinkSync(join(outside, "secret.txt"), join(root, "agents", "escape.md"));
  symlinkSync(outside, join(root, "agents", "outside-dir"));
  execFileSync("mkfifo", [join(root, "agents", "fifo.md")]);
  writeFileSync(join(root, "agents", "huge.md"), "x".repeat(2048));

  it("reads a file under the roots", async () => {
    assert.equal(await readInstructionsFile(join(root, "agents", "AGENTS.md"), [root]), "Be careful.");
  });

  it("a root may itself be hidden (Paperclip's home is ~/.paperclip)", async () => {
    const home = join(root, ".paperclip");
    mkdirSync(join(home, "agents"), { recursive: true });
    writeFileSync(join(home, "agents", "AGENTS.md"), "From home.");
    assert.equal(await readInstructionsFile(join(home, "agents", "AGENTS.md"), [home]), "From home.");
  });

  for (const [name, path, roots, want] of [
    ["the server's environment", "/proc/self/environ", [root], /^Error: it is outside the directories instructions may come from/],
    ["a file outside the roots", join(outside, "secret.txt"), [root], /outside the directories instructions may come from/],
    ["the server's environment, even with / as a root", "/proc/self/environ", ["/"], /which is never read/],
    ["a device, with / as a root", "/dev/null", ["/"], /resolves to \/dev\/null, which is never read/],
    ["the kernel's files, with / as a root", "/sys/kernel", ["/"], /resolves to \/sys\/kernel, which is never read/],
    ["a symlink on the shared volume to /proc/self/environ", join(root, "agents", "environ.md"), [root], /resolves to \/proc\/\d+\/environ|outside/],
    ["a symlink to a file outside the roots", join(root, "agents", "escape.md"), [root], /resolves to .*secret\.txt, outside/],
    ["a path through a symlinked directory", join(root, "agents", "outside-dir", "secret.txt"), [root], /outside/],
    ["a relative path", "agents/AGENTS.md", [root], /not an absolute path/],
    ["a FIFO (would hold the run)", join(root, "agents", "fifo.md"), [root], /not a regular file/],
    ["the server's .env in Paperclip's home", join(root, "instances", "default", ".env"), [root], /through \.env, and hidden files/],
    ["a symlink on the shared volume to the server's .env", join(root, "agents", "planted.md"), [root], /through \.env, and hidden files/],
    ["the secrets master key", join(root, "instances", "default", "secrets", "master.key"), [root], /under a directory named secrets/],
    ["a document under secrets", join(root, "instances", "default", "secrets", "notes.md"), [root], /under a directory named secrets/],
    ["the server's config.json", join(root, "instances", "default", "config.json"), [root], /not a text document/],
  ] as const) {
    it(`refuses ${name}`, async () => {
      await assert.rejects(readInstructionsFile(path, [...roots]), want);
    });
  }

  it("refuses a hard link (a second name for the server's .env)", async () => {
    linkSync(join(root, "instances", "default", ".env"), join(root, "agents", "linked.md"));
    await assert.rejects(readInstructionsFile(join(root, "agents", "linked.md"), [root]), /other hard links/);
  });

  it("confines each company's agents to its own directory with {companyId}", async () => {
    mkdirSync(join(root, "companies", "company-b"), { recursive: true });
    writeFileSync(join(root, "companies", "company-b", "AGENTS.md"), "company B's");
    const roots = rootsFor([join(root, "companies", "{companyId}")], { id: "a1", companyId: "company-a" });
    assert.deepEqual(roots, [join(root, "companies", "company-a")]);
    await assert.rejects(readInstructionsFile(join(root, "companies", "company-b", "AGENTS.md"), roots), /outside/);
    assert.deepEqual(rootsFor([join(root, "{companyId}")], { id: "a1", companyId: "../x" }), [], "an id that could leave its directory drops the root");
  });

  it("says the same of a path outside the roots whether or not it exists", async () => {
    const exists = await readInstructionsFile("/etc/hostname", [root]).catch((e: Error) => e.message);
    const missing = await readInstructionsFile("/etc/no-such-file.md", [root]).catch((e: Error) => e.message);
    assert.equal(exists.replace("/etc/hostname", "X"), missing.replace("/etc/no-such-file.md", "X"));
    assert.match(exists, /outside the directories/);
  });

  it("by default reads an agent's own bundle and its company's projects, never another company's", async () => {
    // Paperclip's home as its image keeps it: two companies, each with an
    // agent's managed bundle and a project checkout.
    const home = mkdtempSync(join(tmpdir(), "clipjob-home-"));
    const instance = join(home, "instances", "default");
    const write = (rel: string) => {
      const path = join(instance, rel);
      mkdirSync(join(path, ".."), { recursive: true });
      writeFileSync(path, `# ${rel}\n`);
      return path;
    };
    const own = write("companies/company-1/agents/agent-1/instructions/AGENTS.md");
    const project = write("projects/company-1/project-1/_default/AGENTS.md");
    const neighbour = write("companies/company-1/agents/agent-2/instructions/AGENTS.md");
    const otherCompany = write("companies/company-2/agents/agent-9/instructions/AGENTS.md");
    const otherProject = write("projects/company-2/project-9/_default/AGENTS.md");
    const loose = write("notes.md");
    try {
      const s = resolveSettings({}, { profile: "claude_local" }, () => {}, { POD_NAMESPACE: "paperclip", PAPERCLIP_HOME: home });
      const roots = rootsFor(s.instructionsRoots, agent);
      assert.equal(await readInstructionsFile(own, roots), "# companies/company-1/agents/agent-1/instructions/AGENTS.md\n");
      assert.equal(await readInstructionsFile(project, roots), "# projects/company-1/project-1/_default/AGENTS.md\n");
      for (const path of [neighbour, otherCompany, otherProject, loose]) {
        await assert.rejects(readInstructionsFile(path, roots), /outside the directories instructions may come from/, path);
      }
      // Another instance's layout, by Paperclip's own variable.
      const other = resolveSettings({}, { profile: "claude_local" }, () => {}, { POD_NAMESPACE: "paperclip", PAPERCLIP_HOME: home, PAPERCLIP_INSTANCE_ID: "staging" });
      assert.ok(other.instructionsRoots.every((r) => r.startsWith(join(home, "instances", "staging") + "/")), other.instructionsRoots.join(" "));
      assert.throws(
        () => resolveSettings({}, { profile: "claude_local" }, () => {}, { POD_NAMESPACE: "paperclip", PAPERCLIP_HOME: home, PAPERCLIP_INSTANCE_ID: "../default" }),
        (err: unknown) => err instanceof SettingsError && /PAPERCLIP_INSTANCE_ID "..\/default" is not a plain path segment/.test(err.message),
      );
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });

  it("refuses a file over the size limit", async () => {
    await assert.rejects(readInstructionsFile(join(root, "agents", "huge.md"), [root], 1024), /2048 bytes, over the 1024/);
  });

  it("a refused file is a note and stays out of the prompt", async () => {
    const p = await buildPrompt(
      { agent, runId: "r", context: {} },
      { instructionsFilePath: "/proc/self/environ", instructionsRoots: [root], promptTemplate: "Hi.", bootstrapPromptTemplate: "" },
      false,
    );
    assert.equal(p.prompt, "Hi.");
    assert.match(p.notes[0], /instructions file \/proc\/self\/environ could not be read \(it is outside the directories/);
  });
});

describe("run env in the pod", () => {
  // What Paperclip 2026.916 puts in a run's config.env and context on its
  // own machine (read from @paperclipai/server's heartbeat service).
  const serverEnv = {
    TMPDIR: "/tmp/paperclip-run-iss-1a2b3c4d5e6f-Xy12",
    TMP: "/tmp/paperclip-run-iss-1a2b3c4d5e6f-Xy12",
    TEMP: "/tmp/paperclip-run-iss-1a2b3c4d5e6f-Xy12",
    PAPERCLIP_RUN_SCRATCH_DIR: "/tmp/paperclip-run-iss-1a2b3c4d5e6f-Xy12",
    GH_CONFIG_DIR: "/home/paperclip/.config/gh",
    PATH: "/tmp/paperclip-github-runtime/run-1:/usr/local/bin:/usr/bin",
    PAPERCLIP_GIT_METADATA_ROOTS: JSON.stringify(["/home/paperclip/.paperclip/instances/default/projects"]),
    GIT_CONFIG_GLOBAL: "/dev/null",
    PAPERCLIP_RUNTIME_TOOLS_MCP_URL: "http://127.0.0.1:3100/api/mcp/runtime-tools",
    PAPERCLIP_GITHUB_BROKER_URL: "http://localhost:3100",
    OTHER_LOCAL: "http://127.0.0.1:9999/x",
    WEBSITE: "https://example.com/docs",
    EXTRA: "/opt/tools",
  };

  it("leaves the server's paths and loopback URLs out, naming them, when pods have no URL for Paperclip", () => {
    const { env, notes } = buildRunEnv(
      { context: { paperclipWorkspace: { cwd: "/paperclip/projects/p/repo", agentHome: "/home/paperclip/.paperclip/instances/default/workspaces/a-1" } } },
      { env: serverEnv, paperclipApiUrl: "", serverApiUrl: "http://127.0.0.1:3100" },
    );
    for (const k of ["TMPDIR", "TMP", "TEMP", "PAPERCLIP_RUN_SCRATCH_DIR", "GH_CONFIG_DIR", "PATH", "PAPERCLIP_GIT_METADATA_ROOTS", "AGENT_HOME", "PAPERCLIP_RUNTIME_TOOLS_MCP_URL", "PAPERCLIP_GITHUB_BROKER_URL", "OTHER_LOCAL"]) {
      assert.equal(env[k], undefined, `${k} reached the pod: ${env[k]}`);
    }
    // What means the same in the pod stays: the shared volume, /dev/null,
    // URLs elsewhere, and the agent's own values that are no server path.
    assert.equal(env.PAPERCLIP_WORKSPACE_CWD, "/paperclip/projects/p/repo");
    assert.equal(env.GIT_CONFIG_GLOBAL, "/dev/null");
    assert.equal(env.WEBSITE, "https://example.com/docs");
    assert.equal(env.EXTRA, "/opt/tools");
    assert.equal(notes.length, 1);
    assert.match(notes[0]!, /TMPDIR \(a path on the Paperclip server outside \/paperclip/);
    assert.match(notes[0]!, /PAPERCLIP_RUNTIME_TOOLS_MCP_URL \(a loopback URL of the Paperclip server, which pods cannot reach \(set CLIPJOB_PAPERCLIP_API_URL/);
    assert.doesNotMatch(notes[0]!, /127\.0\.0\.1|paperclip-run-/, "a note names variables, never their values");
  });

  it("rewrites the server's own loopback URLs to where pods reach Paperclip, and keeps a home on the shared volume", () => {
    const { env, notes } = buildRunEnv(
      { context: { paperclipWorkspace: { agentHome: "/paperclip/instances/default/workspaces/a-1" } } },
      { env: serverEnv, paperclipApiUrl: "http://paperclip.paperclip.svc:3100", serverApiUrl: "http://127.0.0.1:3100" },
    );
    assert.equal(env.PAPERCLIP_RUNTIME_TOOLS_MCP_URL, "http://paperclip.paperclip.svc:3100/api/mcp/runtime-tools");
    assert.equal(env.PAPERCLIP_GITHUB_BROKER_URL, undefined, "localhost:3100 is not the server's URL as Paperclip writes it: left out");
    assert.equal(env.OTHER_LOCAL, undefined, "another loopback port is not Paperclip's API");
    assert.equal(env.AGENT_HOME, "/paperclip/instances/default/workspaces/a-1");
    assert.equal(env.PAPERCLIP_API_URL, "http://paperclip.paperclip.svc:3100");
    assert.ok(notes.some((n) => n.includes("rewritten to http://paperclip.paperclip.svc:3100 for the pod: PAPERCLIP_RUNTIME_TOOLS_MCP_URL")), notes.join("\n"));
  });
});

describe("podEnv", () => {
  it("with the server's home on the volume, keeps only paths in the run's own directories", () => {
    const dirs = mountedRunDirs("a1", "c1", { paperclipHome: "/paperclip", instance: "default" }, "/paperclip");
    assert.ok(dirs);
    const { env, dropped } = podEnv(
      {
        AGENT_HOME: "/paperclip/instances/default/workspaces/a1", // the agent's workspace: mounted
        GH_CONFIG_DIR: "/paperclip/.config/gh", // the server's own: not mounted
        PAPERCLIP_GIT_METADATA_ROOTS: "/paperclip/instances/default/projects/c1:/paperclip/instances/default/projects/c2",
      },
      { serverApiUrl: "http://127.0.0.1:3100", podApiUrl: "", podDirs: dirs },
    );
    assert.deepEqual(env, { AGENT_HOME: "/paperclip/instances/default/workspaces/a1" });
    assert.deepEqual(dropped.map((d) => d.name).sort(), ["GH_CONFIG_DIR", "PAPERCLIP_GIT_METADATA_ROOTS"]);
    assert.match(dropped[0].why, /outside the run's own directories/);
    assert.equal(mountedRunDirs("a1", "c1", { paperclipHome: "/home/node/.paperclip", instance: "default" }, "/paperclip"), undefined);
  });

  const opts = { serverApiUrl: "http://127.0.0.1:3100", podApiUrl: "https://paperclip.example" };
  it("refuses paths that only look like the shared volume", () => {
    const { env } = podEnv({ TMPDIR: "/paperclip/../etc", AGENT_HOME: "/paperclipx/a", TMP: "/paperclip/./x", TEMP: "/paperclip/tmp" }, opts);
    assert.deepEqual(env, { TEMP: "/paperclip/tmp" });
  });
  it("catches every loopback spelling the URL parser knows (hostile review)", () => {
    const { env, dropped } = podEnv(
      {
        A: "http://[::ffff:127.0.0.1]:3100/x",
        B: "http://[::]:3100/x",
        C: "http://localhost.:3100/x",
        D: "http:127.0.0.1:3100/x",
        E: "http:\\\\127.0.0.1:3100\\x",
        F: "postgres://u:p@127.0.0.1:5432/paperclip",
        G: "redis://localhost:6379",
        H: "http://2130706433:3100/",
        I: "http://0x7f.1:3100/",
        J: "http://127.1/",
        K: "C:\\not\\a\\url",
      },
      { serverApiUrl: "", podApiUrl: "" },
    );
    assert.deepEqual(Object.keys(env), ["K"]);
    assert.equal(dropped.length, 10);
  });

  it("reads PAPERCLIP_API_URL with or without /api, as Paperclip does", () => {
    for (const server of ["http://127.0.0.1:3100", "http://127.0.0.1:3100/", "http://127.0.0.1:3100/api", "http://127.0.0.1:3100/api/"]) {
      for (const pods of ["https://pc.example", "https://pc.example/api"]) {
        const { env } = podEnv({ A: "http://127.0.0.1:3100/api/mcp/runtime-tools" }, { serverApiUrl: server, podApiUrl: pods });
        assert.equal(env.A, "https://pc.example/api/mcp/runtime-tools", `${server} -> ${pods}`);
      }
    }
  });

  it("drops a path variable with a relative entry: it would resolve wherever the pod starts", () => {
    assert.deepEqual(podEnv({ PATH: "/paperclip/bin:bin:." }, opts).env, {});
  });

  it("drops a list with any path off the volume, and a path variable that holds no path", () => {
    const { env } = podEnv({ PATH: "/paperclip/bin:/usr/bin", PAPERCLIP_GIT_METADATA_ROOTS: JSON.stringify(["/paperclip/a"]), GH_CONFIG_DIR: "relative/dir" }, opts);
    assert.deepEqual(env, { PAPERCLIP_GIT_METADATA_ROOTS: JSON.stringify(["/paperclip/a"]) });
  });
  it("knows every loopback spelling, and rewrites only the server's origin and base path", () => {
    const { env, dropped } = podEnv(
      {
        A: "http://127.0.0.1:3100/api/x?q=1",
        B: "http://127.1.2.3:3100/api",
        C: "http://[::1]:3100/api",
        D: "ws://localhost:3100/ws",
        E: "http://0.0.0.0:3100/",
        F: "HTTP://127.0.0.1:3100",
      },
      opts,
    );
    assert.deepEqual(env, { A: "https://paperclip.example/api/x?q=1", F: "https://paperclip.example/" });
    assert.deepEqual(dropped.map((d) => d.name).sort(), ["B", "C", "D", "E"]);
  });
});
