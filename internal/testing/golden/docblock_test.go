package golden

import "testing"

func TestDocBlock(t *testing.T) {
	doc := "# T\n\n<!-- a -->\n```yaml\nx: 1\ny: 2\n```\n\n<!-- empty -->\n```\n```\n<!-- loose -->\ntext\n```\nz\n```\n<!-- open -->\n```\nq\n"
	for _, tc := range []struct {
		name, want string
		err        bool
	}{
		{name: "a", want: "x: 1\ny: 2\n"},
		{name: "empty", want: ""},
		{name: "loose", err: true},
		{name: "open", err: true},
		{name: "none", err: true},
	} {
		start, end, err := docBlock(doc, tc.name)
		if (err != nil) != tc.err || (err == nil && doc[start:end] != tc.want) {
			t.Errorf("%s: %q, %v; want %q (error %v)", tc.name, doc[start:end], err, tc.want, tc.err)
		}
	}
}
