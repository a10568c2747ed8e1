# Builds the clipjob binaries into one small image (static, from scratch,
# non-root); the Helm chart runs clipjob-webhook and clipjob-relay from it.
# `make image` assembles the same files without a registry or a container
# engine (internal/ociimage); TestDockerfileMakesTheSameFiles keeps the two
# alike.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/...

FROM scratch
COPY --from=build /out/ /usr/local/bin/
COPY internal/ociimage/rootfs/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/clipjob-webhook"]
