package charts

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite clipjob/README.md from clipjob/values.yaml ("+ChartREADMECommand+")")

// regenerate is what a failure tells to run.
const regenerate = "`" + ChartREADMECommand + "` (that is: go test ./charts -run TestChartREADME -update)"

func readValues(t *testing.T) []byte {
	t.Helper()
	values, err := os.ReadFile(filepath.Join(Name, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return values
}

// TestChartREADME: the committed charts/clipjob/README.md is what
// charts/clipjob/values.yaml generates; with -update it rewrites it.
func TestChartREADME(t *testing.T) {
	want, err := ChartREADME(readValues(t))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(Name, "README.md")
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: generate it with %s", err, regenerate)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("charts/clipjob/README.md is not what charts/clipjob/values.yaml generates: regenerate it with %s and commit it\n(-committed +generated):\n%s",
			regenerate, cmp.Diff(strings.Split(string(got), "\n"), strings.Split(string(want), "\n")))
	}
}

// TestEveryValueIsDescribed: every value a user sets in
// charts/clipjob/values.yaml has a "# --" description, so none is missing
// from the README.
func TestEveryValueIsDescribed(t *testing.T) {
	rows, err := ValueDocs(readValues(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("values.yaml documents no value")
	}
	for _, r := range rows {
		if !r.Described {
			t.Errorf("values.yaml line %d: %s has no description: write a \"# -- ...\" comment right above it (a map set whole, such as resources, takes one too), then run %s",
				r.Line, r.Key, regenerate)
		}
	}
}

// TestValuesTable: the generator on a small document, with each kind of
// value, nesting, a multi-line description, @default and escaping.
func TestValuesTable(t *testing.T) {
	const values = `# A comment about the whole file: not in the table.

# -- The name.
name: demo
# A note for maintainers, before the description: not in the table.
# -- How many,
# on two lines
#
#   (a blank and an indented one).
count: 3
# -- A ratio.
ratio: 0.5
# -- On or off.
enabled: true
# -- Nothing yet.
nothing:
# -- Set whole: its keys get no rows.
resources:
  requests: {cpu: 100m}
  # -- Not a row: resources is documented whole.
  limits: {memory: 1Gi}
server:
  # -- The tag.
  # @default -- the chart's appVersion
  tag: ""
  tls:
    # -- Either a|b, written ` + "`a|b`" + `.
    mode: "a|b"
  # -- Hosts.
  hosts: [a.example, b.example]
  # -- No labels.
  labels: {}
  # -- A list of maps.
  tolerations:
    - {key: k, operator: Exists}
  # -- Keys in file order, <b> and & kept.
  env: {Z: "<b>", A: "&"}
# --
blank: 1
undocumented: x
`
	rows, err := ValueDocs([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	want := "| Key | Type | Default | Description |\n" +
		"|-----|------|---------|-------------|\n" +
		"| name | string | `\"demo\"` | The name. |\n" +
		"| count | int | `3` | How many, on two lines (a blank and an indented one). |\n" +
		"| ratio | float | `0.5` | A ratio. |\n" +
		"| enabled | bool | `true` | On or off. |\n" +
		"| nothing | string | `null` | Nothing yet. |\n" +
		"| resources | object | `{\"requests\":{\"cpu\":\"100m\"},\"limits\":{\"memory\":\"1Gi\"}}` | Set whole: its keys get no rows. |\n" +
		"| server.tag | string | the chart's appVersion | The tag. |\n" +
		"| server.tls.mode | string | `\"a\\|b\"` | Either a\\|b, written `a\\|b`. |\n" +
		"| server.hosts | list | `[\"a.example\",\"b.example\"]` | Hosts. |\n" +
		"| server.labels | object | `{}` | No labels. |\n" +
		"| server.tolerations | list | `[{\"key\":\"k\",\"operator\":\"Exists\"}]` | A list of maps. |\n" +
		"| server.env | object | `{\"Z\":\"<b>\",\"A\":\"&\"}` | Keys in file order, <b> and & kept. |\n" +
		"| blank | int | `1` |  |\n" +
		"| undocumented | string | `\"x\"` |  |\n"
	if diff := cmp.Diff(strings.Split(want, "\n"), strings.Split(ValuesTable(rows), "\n")); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	// What TestEveryValueIsDescribed reports: a leaf with no comment and one
	// with an empty "# --".
	var undescribed []string
	for _, r := range rows {
		if !r.Described {
			undescribed = append(undescribed, r.Key)
		}
	}
	if want := []string{"blank", "undocumented"}; !slices.Equal(undescribed, want) {
		t.Errorf("undescribed %v, want %v", undescribed, want)
	}
	if r := rows[1]; r.Key != "count" || r.Line != 10 {
		t.Errorf("row 1 is %s at line %d, want count at line 10", r.Key, r.Line)
	}
}

// TestValueDocsRefuses: what the generator would otherwise get wrong
// silently is an error naming the key.
func TestValueDocsRefuses(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"# -- A section.\n# @section -- Server\nport: 1\n", "port: unsupported annotation"},
		{"server:\n  # @default -- 1\n  tls:\n    on: true\n", "server.tls: @default without"},
		{"# -- Empty default.\n# @default --\nport: 1\n", "port: empty @default"},
		{"- a\n- b\n", "not a YAML map"},
		{"a: [\n", "yaml:"},
	} {
		_, err := ValueDocs([]byte(tc.values))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.values, err, tc.want)
		}
	}
}
