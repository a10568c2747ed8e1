// Command image assembles the Paperclip image (docs/paperclip.md) from
// files on this machine, with no registry and no container engine; `make
// paperclip-image` runs it through hack/paperclip/image.sh, which gathers
// the inputs:
//
//	go run ./hack/paperclip/image -tag REF -o ARCHIVE -node NODE -server DIR \
//	  -adapters DIR -fakeagent FILE -busybox FILE [-cacerts FILE]
//
// See internal/ociimage's Paperclip for what goes in it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/paperclipai/clipjob/internal/ociimage"
)

func main() {
	tag := flag.String("tag", "", "the image reference to tag the archive with")
	out := flag.String("o", "", "the archive to write")
	var in ociimage.PaperclipInputs
	flag.StringVar(&in.Node, "node", "", "the Node.js 24 binary")
	flag.StringVar(&in.Server, "server", "", "the directory paperclipai is npm-installed in")
	flag.StringVar(&in.Adapters, "adapters", "", "the npm --prefix clipjob's adapter is installed in")
	flag.StringVar(&in.FakeAgent, "fakeagent", "", "a static build of e2e/images/fakeagent")
	flag.StringVar(&in.Busybox, "busybox", "", "a static busybox")
	flag.StringVar(&in.CACerts, "cacerts", "", "the CA bundle the server trusts (optional)")
	flag.Parse()
	if err := run(*tag, *out, in); err != nil {
		fmt.Fprintln(os.Stderr, "paperclip image:", err)
		os.Exit(1)
	}
}

func run(tag, out string, in ociimage.PaperclipInputs) error {
	if tag == "" || out == "" || flag.NArg() != 0 {
		return fmt.Errorf("usage: image -tag REF -o ARCHIVE -node NODE -server DIR -adapters DIR -fakeagent FILE -busybox FILE [-cacerts FILE]")
	}
	start := time.Now()
	spec, missing, err := ociimage.Paperclip(tag, in)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		// Programs of the install the server does not run (an agent CLI's
		// voice host, PostgreSQL extensions loaded into a process that
		// has them): said, not fatal.
		fmt.Fprintf(os.Stderr, "paperclip image: libraries this machine lacks, left out:\n  %s\n", strings.Join(missing, "\n  "))
	}
	if err := ociimage.WriteArchive(out, spec); err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("image %s: %s (%d files, %d MiB) in %s\n", tag, out, len(spec.Files), st.Size()>>20, time.Since(start).Round(time.Second))
	return nil
}
