package bolt_test

import (
	"testing"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/storetest"
)

// TestBoltConformance holds the embedded store to the behaviours every
// store must have (storetest.Conformance).
func TestBoltConformance(t *testing.T) {
	storetest.Conformance(t, storetest.Backend{Open: func(t *testing.T) (store.Backend, func() store.Backend) {
		dir := t.TempDir()
		open := func() store.Backend {
			s, err := bolt.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		return open(), open
	}})
}
