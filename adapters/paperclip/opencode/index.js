// Paperclip's adapter manager loads one adapter per package directory (its
// package.json's "." export), so the OpenCode adapter (opencode_k8s) has
// this directory of its own inside the package: install it the same way,
// with this directory's path.
export * from "../dist/src/opencode.js";
