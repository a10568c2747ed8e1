package bolt

import (
	"time"

	bbolt "go.etcd.io/bbolt"
)

// releaseInterval is how often the store lets go of the pages of its file
// it mapped (releaseMapped), a walk of the page tables costing well under
// a millisecond. At 500 runs in a flood the relay's file-backed memory
// peaked at 60-62 MiB released every 250 ms, 49-50 every 100 ms and 48
// every 50 ms (the binary's code is 30 of it): each commit touches the
// last pages of every run it writes to, which a longer interval lets pile
// up (docs/design/2026-11-26-relay-memory-per-stream.md).
//
// bbolt reads the store through a mapping of the whole file, and every
// page a reader touched stays resident, so the relay's memory grew with
// the store. The pages are the kernel's page cache either way: released
// from the mapping, they leave the relay's resident memory and stay in
// the cache, which the kernel drops under pressure. The mapping is
// read-only and bbolt writes through the file, so a page read again is
// the same page.
const releaseInterval = 100 * time.Millisecond

// releaseMapped releases the pages of the file mapped so far. It runs in
// a read transaction: bbolt maps the file again (elsewhere, as it grows)
// only once no transaction is open, so the range is the mapping's.
func (s *Store) releaseMapped() error {
	return s.db.View(func(tx *bbolt.Tx) error {
		return dontNeed(s.db.Info().Data, uintptr(tx.Size()))
	})
}
