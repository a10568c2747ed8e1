package imageref

import "testing"

func TestParse(t *testing.T) {
	tests := map[string]string{
		"busybox":                       "docker.io/library/busybox:latest",
		"busybox:1.36":                  "docker.io/library/busybox:1.36",
		"ghcr.io/paperclipai/paperclip": "ghcr.io/paperclipai/paperclip:latest",
		"localhost:5000/a/b:v1":         "localhost:5000/a/b:v1",
		"alpine@sha256:" + hex64:        "docker.io/library/alpine@sha256:" + hex64,
		"alpine:3.20@sha256:" + hex64:   "docker.io/library/alpine:3.20@sha256:" + hex64,
	}
	for in, want := range tests {
		img, err := Parse(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if img.String() != want {
			t.Errorf("%s normalizes to %s, want %s", in, img, want)
		}
	}
	for _, bad := range []string{"", "Upper", "a b", "https://ghcr.io/x/y"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestPatternMatch(t *testing.T) {
	tests := []struct {
		pattern, image string
		want           bool
	}{
		{"busybox", "docker.io/library/busybox:1.36", true},
		{"busybox", "busybox", true},
		{"busybox:1.*", "busybox:1.36", true},
		{"busybox:1.*", "busybox:2.0", false},
		{"busybox:1.*", "busybox@sha256:" + hex64, false},
		{"ghcr.io/paperclipai/*", "ghcr.io/paperclipai/paperclip:v1", true},
		{"ghcr.io/paperclipai/*", "ghcr.io/paperclipai/agents/claude:v1", false}, // * does not cross /
		{"ghcr.io/paperclipai/*", "ghcr.io/evil/paperclip:v1", false},
		{"ghcr.io/*/paperclip", "ghcr.io/anyone/paperclip:v1", true},
		{"ghcr.io/paperclipai/agent-runtime-?laude", "ghcr.io/paperclipai/agent-runtime-claude:v1", true},
		{"*", "docker.io/library/nginx", true}, // "*" is docker.io/library/*
		{"*", "quay.io/nginx:1", false},
		{"docker.io/library/*", "quay.io/x/y", false},
		{"alpine@sha256:" + hex64, "alpine@sha256:" + hex64, true},
		{"alpine@sha256:" + hex64, "alpine:3.20", false},
	}
	for _, tt := range tests {
		p, err := ParsePattern(tt.pattern)
		if err != nil {
			t.Fatalf("%s: %v", tt.pattern, err)
		}
		img, err := Parse(tt.image)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Match(img); got != tt.want {
			t.Errorf("%q matches %q (%s): %v, want %v", tt.pattern, tt.image, img, got, tt.want)
		}
	}
	if _, err := ParsePattern("Bad Pattern"); err == nil {
		t.Error("invalid pattern accepted")
	}
}

func TestMutable(t *testing.T) {
	for in, want := range map[string]bool{"busybox": true, "busybox:latest": true, "busybox:1.36": false, "alpine@sha256:" + hex64: false} {
		img, _ := Parse(in)
		if img.Mutable() != want {
			t.Errorf("%s mutable %v", in, img.Mutable())
		}
	}
}
