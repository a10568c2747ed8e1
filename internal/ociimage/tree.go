package ociimage

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Tree lists the host directory dir as image files under imageDir: every
// directory, regular file and symbolic link, with its permission bits. A
// link that points into dir by an absolute path is made to point to the
// same place in the image; other links are kept as they are.
func Tree(dir, imageDir string) ([]File, error) {
	dir = filepath.Clean(dir)
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		at := path.Join(imageDir, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := int64(info.Mode().Perm())
		switch {
		case d.IsDir():
			files = append(files, File{Path: at, Dir: true, Mode: mode})
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if r, err := filepath.Rel(dir, target); filepath.IsAbs(target) && err == nil && !strings.HasPrefix(r, "..") {
				target = path.Join(imageDir, filepath.ToSlash(r))
			}
			files = append(files, File{Path: at, Link: target})
		case d.Type().IsRegular():
			files = append(files, File{Path: at, Source: p, Mode: mode})
		}
		return nil
	})
	return files, err
}

// LibraryDirs are where SharedLibraries looks on the host for a library a
// program needs, in the order the dynamic loader does, for this machine's
// Debian multiarch layout (x86_64 and arm64).
var LibraryDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
	"/lib64", "/usr/lib64", "/lib", "/usr/lib",
}

// SharedLibraries returns the host's shared libraries that the ELF
// programs and libraries among files need and do not find beside them
// (their RUNPATH or RPATH: what an npm package bundles), such as the C
// library, libstdc++ and the dynamic loader, each at its host path, links
// kept as links, and what they need in turn. An image of host-built
// dynamic programs runs with no base image that way. A library found
// nowhere is returned in missing, by name with who needs it, for the caller
// to judge (a program the image never runs may need one this machine
// lacks: a prebuilt module for another platform, an optional extension).
func SharedLibraries(files []File) (libs []File, missing []string, err error) {
	added := map[string]bool{}
	lost := map[string][]string{}
	var addHost func(p string) error
	var needs func(host, who string) error
	// addHost adds the host file p at the same path, and, for a link, its
	// target too.
	addHost = func(p string) error {
		if added[p] {
			return nil
		}
		added[p] = true
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			libs = append(libs, File{Path: p, Link: target})
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			return addHost(filepath.Clean(target))
		}
		libs = append(libs, File{Path: p, Source: p, Mode: int64(info.Mode().Perm())})
		return needs(p, p)
	}
	needs = func(host, who string) error {
		f, err := elf.Open(host)
		if err != nil {
			return nil // not an ELF file after all (a script named .so)
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				b, err := io.ReadAll(prog.Open())
				if err != nil {
					return fmt.Errorf("%s: reading its interpreter: %w", host, err)
				}
				if err := addHost(string(bytes.TrimRight(b, "\x00"))); err != nil {
					return fmt.Errorf("%s: its interpreter: %w", host, err)
				}
			}
		}
		names, err := f.ImportedLibraries()
		if err != nil {
			return nil // static: no dynamic section
		}
		var own []string
		for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
			vals, _ := f.DynString(tag)
			for _, v := range vals {
				for _, d := range strings.Split(v, ":") {
					own = append(own, strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", filepath.Dir(host)), "$ORIGIN", filepath.Dir(host)))
				}
			}
		}
		for _, n := range names {
			found := ""
			for _, d := range own {
				if _, err := os.Stat(filepath.Join(d, n)); err == nil {
					found = "beside it"
					break
				}
			}
			if found != "" {
				continue
			}
			for _, d := range LibraryDirs {
				if _, err := os.Lstat(filepath.Join(d, n)); err == nil {
					found = filepath.Join(d, n)
					break
				}
			}
			if found == "" {
				lost[n] = append(lost[n], who)
				continue
			}
			if err := addHost(found); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range files {
		if f.Source == "" || !isELF(f.Source) {
			continue
		}
		if err := needs(f.Source, f.Path); err != nil {
			return nil, nil, err
		}
	}
	for n, who := range lost {
		sort.Strings(who)
		missing = append(missing, fmt.Sprintf("%s (needed by %d files, e.g. %s)", n, len(who), who[0]))
	}
	sort.Strings(missing)
	return libs, missing, nil
}

// isELF reports whether the file at p starts with the ELF magic.
func isELF(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	return err == nil && string(magic[:]) == elf.ELFMAG
}
