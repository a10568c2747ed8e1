package bolt

import "golang.org/x/sys/unix"

// dontNeed drops the pages in [addr, addr+n) from this process's page
// tables (madvise MADV_DONTNEED); for a shared mapping of a file they
// stay in the page cache.
func dontNeed(addr, n uintptr) error {
	n &^= uintptr(unix.Getpagesize() - 1)
	if n == 0 {
		return nil
	}
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, addr, n, unix.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}
