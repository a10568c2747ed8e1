package layout

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/paperclipai/clipjob"

// clients are what a pure core must not depend on, even indirectly: the
// cores run in the offline CLI and in golden tests, with no cluster.
var clients = []string{"k8s.io/client-go/", "sigs.k8s.io/controller-runtime"}

// rulesFile is the table of rooms, relative to the module root.
const rulesFile = "internal/layout/rooms.md"

// room is one row of the table in rulesFile.
type room struct {
	pattern string   // "relay/..." or "config/"
	may     []string // patterns of module packages it may import
	anyPkg  bool     // "anything"
	clients bool     // may depend on Kubernetes clients
}

func (r room) matches(pkg string) bool { return match(r.pattern, pkg) }

// match reports whether the module-relative pkg is pattern's package, or
// one under it for "dir/...".
func match(pattern, pkg string) bool {
	if dir, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == dir || strings.HasPrefix(pkg, dir+"/")
	}
	return pkg == strings.TrimSuffix(pattern, "/")
}

var backticked = regexp.MustCompile("`([^`]+)`")

// readRooms parses the table of rulesFile: every row whose first cell is
// a backticked room.
func readRooms(t *testing.T, root string) []room {
	t.Helper()
	f, err := os.Open(filepath.Join(root, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rooms []room
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("%s row %q: want | room | owns | may import |", rulesFile, line)
		}
		name := backticked.FindStringSubmatch(cells[0])
		r := room{pattern: name[1]}
		may := cells[2]
		r.anyPkg = strings.Contains(may, "anything")
		r.clients = r.anyPkg || strings.Contains(may, "Kubernetes clients")
		for _, m := range backticked.FindAllStringSubmatch(may, -1) {
			r.may = append(r.may, m[1])
		}
		rooms = append(rooms, r)
	}
	if len(rooms) < 5 {
		t.Fatalf("%s has no table of rooms (found %d rows)", rulesFile, len(rooms))
	}
	return rooms
}

type goPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T, root string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportsFollowTheLayout: every package has a room, imports only what
// its room may, and reaches a Kubernetes client only where allowed. Test
// files are free to import test helpers; this checks the code that ships.
func TestImportsFollowTheLayout(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	rooms := readRooms(t, root)
	for _, p := range listPackages(t, root) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "internal/layout" {
			continue
		}
		i := slices.IndexFunc(rooms, func(r room) bool { return r.matches(rel) })
		if i < 0 {
			t.Errorf("%s has no row in %s: add one saying what it owns and may import", rel, rulesFile)
			continue
		}
		r := rooms[i]
		for _, imp := range p.Imports {
			dep, ok := strings.CutPrefix(imp, module+"/")
			if !ok || r.anyPkg || match(r.pattern, dep) {
				continue
			}
			if !slices.ContainsFunc(r.may, func(m string) bool { return match(m, dep) }) {
				t.Errorf("%s imports %s, which its room (%s) may not; see %s", rel, dep, r.pattern, rulesFile)
			}
		}
		if r.clients {
			continue
		}
		for _, dep := range p.Deps {
			if slices.ContainsFunc(clients, func(c string) bool { return strings.HasPrefix(dep, c) }) {
				t.Errorf("%s depends on %s: its room (%s) is a pure core and must not reach a Kubernetes client", rel, dep, r.pattern)
				break
			}
		}
	}
}

// TestRoomRules: the checker itself, on a small table.
func TestRoomRules(t *testing.T) {
	relay := room{pattern: "relay/...", may: []string{"contract"}}
	for _, tc := range []struct {
		pkg  string
		want bool
	}{{"relay", true}, {"relay/store", true}, {"relayx", false}, {"webhook", false}} {
		if got := relay.matches(tc.pkg); got != tc.want {
			t.Errorf("relay/... matches %s = %v", tc.pkg, got)
		}
	}
	if !match("config/", "config") || match("config/", "config/sub") {
		t.Error("a plain room is one package")
	}
}
