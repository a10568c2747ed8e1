// Package ociimage assembles container images from files on the host, with
// no registry and no container engine: a layer tarball written here, an
// image config, and a docker-archive file that `ctr images import`,
// `docker load` and `kind load image-archive` all read.
//
// `make image` builds clipjob's own image with it (Clipjob lists the files:
// the binaries of ./cmd and the nonroot user of rootfs/), and the e2e suite
// builds its test images the same way (a pause image, the fake agent). The
// Dockerfile, for those who have registries, makes an image with the same
// files; TestDockerfileMakesTheSameFiles compares the two.
package ociimage
