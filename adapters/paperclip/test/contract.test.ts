// The adapter's copy of the bare-Job contract must match clipjob's Go
// package contract, which the webhooks and the relay use.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";

import * as contract from "../src/contract.js";

const goContract = fileURLToPath(new URL("../../../../contract/contract.go", import.meta.url));

describe("contract", () => {
  it("names what clipjob's contract package names", { skip: !existsSync(goContract) && "not inside the clipjob repository" }, () => {
    const go = readFileSync(goContract, "utf8");
    const goStrings = new Set([...go.matchAll(/"([^"\n]*)"/g)].map((m) => m[1]));
    // Not in contract.go: the shared volume's path is clipjob's config
    // default, the audience the relay's flag default.
    const elsewhere = new Set(["SHARED_VOLUME_PATH", "RELAY_TOKEN_AUDIENCE"]);
    for (const [name, value] of Object.entries(contract)) {
      if (elsewhere.has(name) || typeof value !== "string") continue;
      assert.ok(goStrings.has(value), `${name} = ${JSON.stringify(value)} is not in contract/contract.go`);
    }
  });
});
