package store

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestLineJSONIsJSONMarshals: the stores write a line's JSON by hand, and
// the API serves it as the event's JSON, byte for byte json.Marshal's.
func TestLineJSONIsJSONMarshals(t *testing.T) {
	for _, text := range []string{"", "plain", `{"type":"assistant","text":"a \"quoted\" \\ path"}`, "tab\tnl\ncr\rbs\bff\fvt\v\x00\x1f\x7f",
		"<script>&amp;</script>", "ünï©ødé 日本 🎉", "bad \xff\xfe utf8 \xe2\x82", "\u2028\u2029", "\ufffd valid", strings.Repeat("x", 5000)} {
		checkLineJSON(t, Line{Seq: 42, TS: time.Date(2026, 11, 29, 7, 0, 0, 123456789, time.UTC), Container: "agent", Line: text})
	}
	checkLineJSON(t, Line{Seq: MaxSeq, TS: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", 3600)), Container: "c<1>", Line: "x"})
	if _, err := (&Line{TS: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}).AppendJSON(nil); err == nil {
		t.Error("a year json.Marshal refuses was encoded")
	}
}

func FuzzLineJSON(f *testing.F) {
	f.Add("agent", `{"a":"<\u2028>"}`, int64(0))
	f.Fuzz(func(t *testing.T, container, text string, ns int64) {
		checkLineJSON(t, Line{Seq: uint64(ns), TS: time.Unix(0, ns).UTC(), Container: container, Line: text})
	})
}

func checkLineJSON(t *testing.T, l Line) {
	t.Helper()
	want, err := json.Marshal(&l)
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.AppendJSON([]byte("prefix"))
	if err != nil || string(got) != "prefix"+string(want) {
		t.Errorf("AppendJSON(%q) = %s, %v\nwant %s", l.Line, got, err, want)
	}
}
