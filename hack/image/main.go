// Command image assembles clipjob's container image from binaries built on
// this machine, with no registry and no container engine (`make image`):
//
//	go run ./hack/image -tag ghcr.io/paperclipai/clipjob:0.1.0 -o bin/clipjob-image.tar bin/image
//
// The directory holds static builds of ./cmd/...; the archive is a
// docker-archive that `docker load`, `ctr images import` and `kind load
// image-archive` read. See internal/ociimage for what goes in it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/paperclipai/clipjob/internal/ociimage"
)

func main() {
	tag := flag.String("tag", "", "the image reference to tag the archive with")
	out := flag.String("o", "", "the archive to write")
	flag.Parse()
	if err := run(*tag, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(tag, out string, args []string) error {
	if tag == "" || out == "" || len(args) != 1 {
		return fmt.Errorf("usage: image -tag REF -o ARCHIVE BINDIR")
	}
	spec, err := ociimage.ClipjobFromDir(tag, args[0])
	if err != nil {
		return err
	}
	if err := ociimage.WriteArchive(out, spec); err != nil {
		return err
	}
	fmt.Printf("image %s: %s (%d files)\n", tag, out, len(spec.Files))
	return nil
}
