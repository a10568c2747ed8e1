// Package imageref normalizes container image references and matches them
// against allowlist globs, with github.com/distribution/reference doing the
// parsing, so "busybox" means docker.io/library/busybox:latest everywhere.
package imageref

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// Image is a normalized reference.
type Image struct {
	// Name is the full repository, e.g. docker.io/library/busybox.
	Name string
	// Tag is the tag, "latest" when the reference has neither tag nor digest.
	Tag string
	// Digest is the digest, if any.
	Digest string
}

// String is the normalized reference.
func (i Image) String() string {
	s := i.Name
	if i.Tag != "" {
		s += ":" + i.Tag
	}
	if i.Digest != "" {
		s += "@" + i.Digest
	}
	return s
}

// Mutable reports whether the image is by tag only and the tag is one that
// moves (latest, or none).
func (i Image) Mutable() bool { return i.Digest == "" && i.Tag == "latest" }

// Parse normalizes an image reference.
func Parse(s string) (Image, error) {
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return Image{}, fmt.Errorf("image %q: %w", s, err)
	}
	named = reference.TagNameOnly(named)
	img := Image{Name: named.Name()}
	if t, ok := named.(reference.Tagged); ok {
		img.Tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		img.Digest = d.Digest().String()
		if img.Tag == "latest" && !strings.Contains(s, ":latest") {
			img.Tag = "" // TagNameOnly added it; by-digest references have none
		}
	}
	return img, nil
}

// Pattern is a normalized allowlist glob: "*" matches within one path
// segment (never "/"), "?" one character. A pattern without tag or digest
// matches every tag and digest of the repositories it names.
type Pattern struct {
	Source            string
	name, tag, digest *regexp.Regexp
	hasTag, hasDigest bool
}

// glob stands in for "*" while the pattern goes through the reference
// parser, which accepts it in both repository paths and tags.
const glob, one = "x0glob0x", "x0one0x"

// ParsePattern normalizes an allowlist glob such as "ghcr.io/paperclipai/*"
// or "busybox:1.*".
func ParsePattern(p string) (Pattern, error) {
	if p == "" {
		return Pattern{}, fmt.Errorf("empty image pattern")
	}
	marked := strings.NewReplacer("*", glob, "?", one).Replace(p)
	named, err := reference.ParseNormalizedNamed(marked)
	if err != nil {
		return Pattern{}, fmt.Errorf("image pattern %q: %w", p, err)
	}
	pat := Pattern{Source: p, name: compile(named.Name())}
	if t, ok := named.(reference.Tagged); ok {
		pat.tag, pat.hasTag = compile(t.Tag()), true
	}
	if d, ok := named.(reference.Digested); ok {
		pat.digest, pat.hasDigest = compile(d.Digest().String()), true
	}
	return pat, nil
}

func compile(s string) *regexp.Regexp {
	q := regexp.QuoteMeta(s)
	q = strings.ReplaceAll(q, glob, `[^/]*`)
	q = strings.ReplaceAll(q, one, `[^/]`)
	return regexp.MustCompile("^" + q + "$")
}

// Match reports whether img matches the pattern.
func (p Pattern) Match(img Image) bool {
	if !p.name.MatchString(img.Name) {
		return false
	}
	if p.hasTag && (img.Tag == "" || !p.tag.MatchString(img.Tag)) {
		return false
	}
	if p.hasDigest && (img.Digest == "" || !p.digest.MatchString(img.Digest)) {
		return false
	}
	return true
}
