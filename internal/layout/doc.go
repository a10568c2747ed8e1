// Package layout holds the tests that keep the module's rooms apart and its
// documents honest. The rules are in rooms.md beside this file (each room,
// what it owns, what it may import): the test fails when a package imports
// one its row does not allow, when a pure core reaches a Kubernetes
// client, or when a package has no row. The prose of the manual is free to
// change; only rooms.md is read as rules. It also checks that every test
// and golden case the README and the manual name as the proof of a promise
// exists.
package layout
