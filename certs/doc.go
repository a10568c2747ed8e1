// Package certs is the webhook's own PKI, the chart's default
// (certificates.mode selfManaged): a CA and serving certificates kept in
// Secrets, the CA bundle injected into clipjob's webhook configurations,
// and renewal before expiry — the job cert-manager does when it is
// installed (certificates.mode certManager).
//
// Every replica runs the same loop; writes go through the API server's
// optimistic concurrency, so replicas never need to agree otherwise. No
// admission fails during a rotation: a new CA joins the injected bundle
// beside the old one, and serving certificates move to it only after the
// bundle has had time to reach the API server; the old CA stays trusted
// until it expires. The relay's serving certificate comes from the same
// loop, into its own Secret, which the relay mounts.
package certs
