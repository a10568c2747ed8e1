import assert from "node:assert/strict";
import { linkSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { CLAUDE_ADAPTER, createClipjobAdapter, OPENCODE_ADAPTER } from "../src/adapter.js";
import { planSkills, skillDescription, skillSnapshot, skillsPrompt, skillWarnings } from "../src/skills.js";
import { configWith, entry, layout, made } from "./skills-fixture.js";

const OPERATIONAL = "paperclipai/paperclip/paperclip";

describe("company skills in the run's pod", () => {
  it("gives the agent its enabled skills from the company's skills directory, and warns of the others", async () => {
    const l = layout();
    made.push(l.top);
    const config = configWith(
      [
        entry(OPERATIONAL, l.bundled, "paperclip"),
        entry("company/c1/deploy", l.deploy, "deploy--1a2b"),
        entry("company/c1/review", l.review, "review--3c4d"),
        { ...entry("company/c1/gone", join(l.skills, "__runtime__", "gone")), sourceStatus: "missing", missingDetail: "Failed to materialize skill files: boom" },
      ],
      ["company/c1/deploy", "company/c1/gone"],
    );
    const plan = await planSkills(config, "c1", l.home);
    assert.equal(plan.skillsDir, l.skills);
    assert.deepEqual(plan.desired, [OPERATIONAL, "company/c1/deploy", "company/c1/gone"], "Paperclip's operational skill is always enabled, as for its local adapters");
    assert.deepEqual(plan.offered, [
      { key: "company/c1/deploy", runtimeName: "deploy--1a2b", dir: l.deploy, skillFile: join(l.deploy, "SKILL.md"), description: "Ship a release to staging." },
    ]);
    const warnings = skillWarnings(plan);
    assert.equal(warnings.length, 2);
    assert.match(warnings[0], new RegExp(`^Warning: skill "${OPERATIONAL}" is enabled for this agent but its files are unavailable in the run's pod and it was not given to the agent: its files are at .*/server/node_modules/.*, outside the company's skills directory`));
    assert.match(warnings[1], /^Warning: skill "company\/c1\/gone" .*: Failed to materialize skill files: boom$/);

    const prompt = skillsPrompt(plan);
    assert.match(prompt, /## Company skill library/);
    assert.match(prompt, /- company\/c1\/deploy — enabled\n/);
    assert.match(prompt, /- company\/c1\/review — installed, not enabled for you/);
    assert.match(prompt, new RegExp(`- ${OPERATIONAL} — enabled but unavailable: its files are not in the company's skills directory this run's pod mounts`));
    assert.ok(!prompt.includes("node_modules"), "the server's own paths stay out of the prompt (it is in a pod annotation)");
    assert.ok(prompt.includes(`- deploy--1a2b (company/c1/deploy): ${join(l.deploy, "SKILL.md")} — Ship a release to staging.`), prompt);
    assert.ok(!prompt.includes(l.review), "a skill not enabled for the agent is not pointed at");
  });

  // Hostile: links on the way to a skill, or a skill's SKILL.md, planted
  // while the volume was open to pods (or by whoever writes the company's
  // skills directory), must not lead the server's reads elsewhere, nor be
  // offered to the agent as its company's skill.
  it("offers no skill reached through a symbolic link, and reads nothing through one", async () => {
    const l = layout();
    made.push(l.top);
    // A skill whose directory is a link to another company's skill.
    symlinkSync(l.otherCompany, join(l.skills, "escape"));
    // A skill whose SKILL.md is a link to the server's .env.
    mkdirSync(join(l.skills, "envlink"));
    symlinkSync(join(l.root, ".env"), join(l.skills, "envlink", "SKILL.md"));
    // A skill below a directory that is a link out of the company's skills.
    symlinkSync(join(l.root, "skills", "c2"), join(l.skills, "up"));
    // A skill whose SKILL.md is a hard link to another company's.
    mkdirSync(join(l.skills, "hard"));
    linkSync(join(l.otherCompany, "SKILL.md"), join(l.skills, "hard", "SKILL.md"));
    const config = configWith(
      [
        entry("company/c1/escape", join(l.skills, "escape")),
        entry("company/c1/envlink", join(l.skills, "envlink")),
        entry("company/c1/up", join(l.skills, "up", "secret--5e6f")),
        entry("company/c1/dotdot", `${l.skills}/../c2/secret--5e6f`),
        entry("company/c1/hard", join(l.skills, "hard")),
        entry("company/c1/deploy", l.deploy, "deploy--1a2b"),
      ],
      ["company/c1/escape", "company/c1/envlink", "company/c1/up", "company/c1/dotdot", "company/c1/hard", "company/c1/deploy"],
    );
    const plan = await planSkills(config, "c1", l.home);
    assert.deepEqual(plan.offered.map((s) => s.key), ["company/c1/deploy"]);
    const why = Object.fromEntries(plan.unavailable.map((u) => [u.key, u.why]));
    assert.match(why["company/c1/escape"], /escape is a symbolic link, which the server does not follow/);
    assert.match(why["company/c1/envlink"], /SKILL\.md is a symbolic link, which the server does not follow/);
    assert.match(why["company/c1/up"], /up is a symbolic link/);
    assert.match(why["company/c1/dotdot"], /outside the company's skills directory/);
    assert.match(why["company/c1/hard"], /has other hard links/);
    const prompt = skillsPrompt(plan);
    assert.ok(!prompt.includes("STOLEN") && !prompt.includes("server-secret"), "nothing read through a link reaches the prompt");
    assert.ok(!prompt.includes(l.otherCompany) && !prompt.includes(join(l.skills, "escape")), prompt);
    assert.equal(readFileSync(join(l.root, ".env"), "utf8"), "PAPERCLIP_AGENT_JWT_SECRET=server-secret\n", "nothing was written");
  });

  it("offers nothing when the pod mounts no skills directory", async () => {
    const l = layout();
    made.push(l.top);
    const config = configWith([entry("company/c1/deploy", l.deploy, "deploy--1a2b")], ["company/c1/deploy"]);
    const offVolume = await planSkills(config, "c1", { ...l.home, sharedVolume: join(l.top, "elsewhere") });
    assert.equal(offVolume.skillsDir, undefined);
    assert.deepEqual(offVolume.offered, []);
    assert.match(skillWarnings(offVolume)[0], /the run's pod mounts no skills directory/);
    // A company id that would walk the tree names no directory.
    assert.equal((await planSkills(config, "..", l.home)).skillsDir, undefined);
    // Another company's run does not get c1's skills.
    assert.deepEqual((await planSkills(config, "c2", l.home)).offered, []);
  });

  it("looks for no skills beside its own package when Paperclip passes no library", async () => {
    const plan = await planSkills({}, "c1", { paperclipHome: "/paperclip", instance: "default", sharedVolume: "/paperclip" });
    assert.deepEqual(plan.entries, []);
    assert.equal(skillsPrompt(plan), "");
  });

  it("reads a SKILL.md's description from its front matter, on one line", () => {
    assert.equal(skillDescription("---\nname: x\ndescription: Does it.\n---\nbody"), "Does it.");
    assert.equal(skillDescription('---\ndescription: "Quoted: yes"\n---\n'), "Quoted: yes");
    assert.equal(skillDescription("---\ndescription: |\n  Two\n  lines\nname: x\n---\n"), "Two lines");
    assert.equal(skillDescription("# no front matter\ndescription: no"), "");
    // A line separator in skill-authored text adds no line to the prompt.
    assert.equal(skillDescription("---\ndescription: a\u2028b\r\n---\n"), "a b");
  });

  it("is offered by both adapter types as Paperclip's local adapters offer it (ephemeral)", async () => {
    const l = layout();
    made.push(l.top);
    const config = configWith([entry(OPERATIONAL, l.bundled, "paperclip"), entry("company/c1/deploy", l.deploy, "deploy--1a2b")], ["company/c1/deploy"]);
    for (const def of [CLAUDE_ADAPTER, OPENCODE_ADAPTER]) {
      const adapter = createClipjobAdapter(def, { runHome: l.home });
      assert.ok(adapter.listSkills && adapter.syncSkills, `${def.type} offers listSkills and syncSkills`);
      const ctx = { agentId: "a1", companyId: "c1", adapterType: def.type, config };
      for (const snap of [await adapter.listSkills(ctx), await adapter.syncSkills(ctx, ["company/c1/deploy"])]) {
        assert.equal(snap.adapterType, def.type);
        assert.equal(snap.supported, true);
        assert.equal(snap.mode, "ephemeral");
        const byKey = Object.fromEntries(snap.entries.map((e) => [e.key, e]));
        assert.equal(byKey["company/c1/deploy"].state, "configured");
        assert.match(byKey["company/c1/deploy"].detail ?? "", /read-only in its pod at .*deploy--1a2b/);
        assert.equal(byKey[OPERATIONAL].state, "missing");
        assert.equal(byKey[OPERATIONAL].desired, true);
      }
    }
    const off = await skillSnapshot("claude_k8s", { agentId: "a1", companyId: "c1", adapterType: "claude_k8s", config }, { ...l.home, sharedVolume: "/elsewhere" });
    assert.match(off.warnings.join("\n"), /mounts no skills directory/);
  });
});
