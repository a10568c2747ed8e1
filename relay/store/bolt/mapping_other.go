//go:build !linux

package bolt

// dontNeed: elsewhere the mapping stays as bbolt left it.
func dontNeed(addr, n uintptr) error { return nil }
