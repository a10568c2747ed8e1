package store

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

// releaseInterval is how often the store lets go of the pages of its file
// it has mapped (releaseMapped): a release costs a walk of the mapping's
// page tables, well under a millisecond for a store of 500 MiB, and what
// readers touch meanwhile (the newest lines, at 11 MiB/s in the fleet
// bench's flood) stays resident until the next.
const releaseInterval = 250 * time.Millisecond

// bbolt reads the store through a mapping of the whole file, and every
// page a reader touched stays mapped: the SSE clients read each line
// once, so the relay's resident memory grew with the store (308 of the
// 691 MiB it measured at 500 runs, docs/benchmarks.md). Those pages are
// the kernel's page cache either way; releasing them from the mapping
// every releaseInterval keeps in the relay's resident memory only what
// it read since, and leaves the cache to the kernel, which drops it under
// pressure. The mapping is read-only and bbolt writes through the file,
// so a page read again is the same page from the cache.
func (s *Store) releaseEvery(interval time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			_ = s.releaseMapped()
		}
	}
}

// releaseMapped releases the pages of the file mapped so far. It runs in
// a read transaction: bbolt maps the file again (elsewhere, as it grows)
// only once no transaction is open, so the range is the mapping's.
func (s *Store) releaseMapped() error {
	return s.db.View(func(tx *bolt.Tx) error {
		return dontNeed(s.db.Info().Data, uintptr(tx.Size()))
	})
}

// stopReleasingMapped ends releaseEvery and waits for it.
func (s *Store) stopReleasingMapped() {
	s.closeOnce.Do(func() {
		close(s.stopReleasing)
		<-s.released
	})
}
