// Package runsecret makes an agent Job own the Secrets made for its run —
// its env Secret (paperclip.io/env-secret) and its prompt Secret
// (paperclip.io/prompt-secret) — so the garbage collector deletes them
// with the Job, at its TTL or when it is deleted, and an adapter leaves no
// per-run credentials behind.
//
// A Secret is taken only if it was made for the run
// (contract.SecretMadeForRun: labeled with the Job's run id, and with its
// agent id or named for the Job), the operator does not share it
// (policy.secrets.shared), and no other Job owns it: the Job's
// annotations can change after admission, and owning a Secret means
// deleting it, so naming one of the server's Secrets must not make it
// disappear with an agent's Job. The reconciler runs on the elected replica
// beside the claim controller, on the manager's cache of agent Jobs, and
// writes only an owner reference. A Secret the Job names that is not there
// yet is looked for again while the run lasts: a client may make it after
// the Job (policy.secrets.createdAfterJob).
package runsecret
