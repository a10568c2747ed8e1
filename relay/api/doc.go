// Package api serves the relay's runs and logs over HTTP: the run list and
// records as JSON, a run's log as plain text, NDJSON or Server-Sent Events
// that resume from a sequence number and follow until the run ends. Every
// request is authenticated by TokenReview and authorized by a
// SubjectAccessReview for get pods/log in the run's namespace (auth.go).
package api
