// Package layout holds the test that keeps the module's rooms apart: it
// reads the "Layout" table of the README (each package, what it owns, what
// it may import) and fails when a package imports one its row does not
// allow, when a pure core reaches a Kubernetes client, or when a package
// has no row. The README is the rule; this package only enforces it. It
// also checks that every test and golden case the README and
// docs/security.md name as the proof of a promise exists.
package layout
