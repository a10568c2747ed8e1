package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// troubleshootingDoc is the chapter that lists every error a user can
// get, relative to the module root.
var troubleshootingDoc = filepath.Join("docs", "troubleshooting.md")

// TestTroubleshootingListsEveryCode: every code a user can meet — read
// from the sources that produce it, not from a list kept here — appears
// in backticks in docs/troubleshooting.md, so a new refusal, Status cause,
// doctor check, relay status or adapter error code cannot ship without its
// entry. Each extraction must find something: a pattern that silently
// matched nothing would pass any document.
func TestTroubleshootingListsEveryCode(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, troubleshootingDoc))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(string(b), -1) {
		documented[m[1]] = true
	}

	adapterSrc := filepath.Join(root, "adapters", "paperclip", "src")
	groups := []struct {
		what, where string
		codes       []string
	}{
		{"policy rule (the rule label of clipjob_policy_decisions_total)", "policy/: const Rule*",
			stringConstsWithPrefix(t, filepath.Join(root, "policy"), "Rule")},
		{"Status cause of a 409", "contract/: const Cause*",
			stringConstsWithPrefix(t, filepath.Join(root, "contract"), "Cause")},
		{"admission answer (HTTP code and Status reason)", "decide/, webhook/: http.Status* with metav1.StatusReason*",
			answersBuilt(t, filepath.Join(root, "decide"), filepath.Join(root, "webhook"))},
		{"field error type (the word after a field path in a refusal)", "policy/, templates/, config/: field.* constructors",
			fieldErrorTypes(t, filepath.Join(root, "policy"), filepath.Join(root, "templates"), filepath.Join(root, "config"))},
		{"clipjob doctor check", "doctor/: fail(\"…\") and pass(\"…\")",
			doctorCheckNames(t, filepath.Join(root, "doctor"))},
		{"relay API status", "relay/api/: http.Status*",
			answersBuilt(t, filepath.Join(root, "relay", "api"))},
		{"Paperclip adapter errorCode", "adapters/paperclip/src: ErrorCodes and errorCode: \"…\"",
			adapterErrorCodes(t, adapterSrc)},
		{"Paperclip adapter environment check", "adapters/paperclip/src: code: \"…\"",
			adapterMatches(t, adapterSrc, regexp.MustCompile(`\bcode:\s*"([^"]+)"`))},
	}
	for _, g := range groups {
		if len(g.codes) == 0 {
			t.Errorf("found no %s in %s: the extraction is broken, not the document", g.what, g.where)
			continue
		}
		t.Logf("%d %s codes from %s", len(g.codes), g.what, g.where)
		for _, c := range g.codes {
			if !documented[c] {
				t.Errorf("%s `%s` (from %s) is not in %s: add an entry saying what it means and what to do",
					g.what, c, g.where, troubleshootingDoc)
			}
		}
	}
}

// parseGoDir parses the non-test Go files of dir.
func parseGoDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	fset := token.NewFileSet()
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Errorf("no Go files in %s", dir)
	}
	return files
}

// importedAs is the name file uses for the package at path, or "".
func importedAs(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == path {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return path[strings.LastIndex(path, "/")+1:]
		}
	}
	return ""
}

// selectorOf returns sel when e is pkg.sel, else "".
func selectorOf(e ast.Expr, pkg string) string {
	s, ok := e.(*ast.SelectorExpr)
	if !ok || pkg == "" {
		return ""
	}
	if x, ok := s.X.(*ast.Ident); ok && x.Name == pkg {
		return s.Sel.Name
	}
	return ""
}

// stringConstsWithPrefix returns the values of the string constants of
// dir whose names start with prefix. One whose value is not a string
// literal is an error: the test cannot read it, so it cannot check it.
func stringConstsWithPrefix(t *testing.T, dir, prefix string) []string {
	t.Helper()
	var out []string
	for _, f := range parseGoDir(t, dir) {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, prefix) {
						continue
					}
					var lit *ast.BasicLit
					if i < len(vs.Values) {
						lit, _ = vs.Values[i].(*ast.BasicLit)
					}
					if lit == nil || lit.Kind != token.STRING {
						t.Errorf("%s: constant %s is not a string literal; extend this test to read it", dir, name.Name)
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// httpCodes and statusReasons name the constants an answer is built from.
// One not listed fails the test: add it here, and its entry to the doc.
var (
	httpCodes = map[string]int{
		"StatusOK": http.StatusOK, "StatusNoContent": http.StatusNoContent,
		"StatusBadRequest": http.StatusBadRequest, "StatusUnauthorized": http.StatusUnauthorized,
		"StatusForbidden": http.StatusForbidden, "StatusNotFound": http.StatusNotFound,
		"StatusMethodNotAllowed": http.StatusMethodNotAllowed, "StatusConflict": http.StatusConflict,
		"StatusUnprocessableEntity": http.StatusUnprocessableEntity, "StatusTooManyRequests": http.StatusTooManyRequests,
		"StatusInternalServerError": http.StatusInternalServerError, "StatusServiceUnavailable": http.StatusServiceUnavailable,
		"StatusGatewayTimeout": http.StatusGatewayTimeout,
	}
	statusReasons = map[string]metav1.StatusReason{
		"StatusReasonBadRequest": metav1.StatusReasonBadRequest, "StatusReasonUnauthorized": metav1.StatusReasonUnauthorized,
		"StatusReasonForbidden": metav1.StatusReasonForbidden, "StatusReasonNotFound": metav1.StatusReasonNotFound,
		"StatusReasonAlreadyExists": metav1.StatusReasonAlreadyExists, "StatusReasonConflict": metav1.StatusReasonConflict,
		"StatusReasonInvalid": metav1.StatusReasonInvalid, "StatusReasonTooManyRequests": metav1.StatusReasonTooManyRequests,
		"StatusReasonInternalError": metav1.StatusReasonInternalError, "StatusReasonServiceUnavailable": metav1.StatusReasonServiceUnavailable,
		"StatusReasonTimeout": metav1.StatusReasonTimeout,
	}
)

// answersBuilt returns each answer the code of dirs builds: "422 Invalid"
// where one call or composite literal names both an HTTP status and a
// Status reason (decide.Refusal, the webhook's denial), else "500" for an
// HTTP status alone (admission.Errored, the relay's fail).
func answersBuilt(t *testing.T, dirs ...string) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for _, dir := range dirs {
		for _, f := range parseGoDir(t, dir) {
			httpPkg, metaPkg := importedAs(f, "net/http"), importedAs(f, "k8s.io/apimachinery/pkg/apis/meta/v1")
			ast.Inspect(f, func(n ast.Node) bool {
				var parts []ast.Expr
				switch n := n.(type) {
				case *ast.CallExpr:
					parts = n.Args
				case *ast.CompositeLit:
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							e = kv.Value
						}
						parts = append(parts, e)
					}
				default:
					return true
				}
				var codes []int
				var reason string
				for _, p := range parts {
					if name := selectorOf(p, httpPkg); strings.HasPrefix(name, "Status") {
						c, ok := httpCodes[name]
						if !ok {
							t.Errorf("%s: http.%s is not in httpCodes of %s", dir, name, "troubleshooting_test.go")
						}
						codes = append(codes, c)
					}
					if name := selectorOf(p, metaPkg); strings.HasPrefix(name, "StatusReason") {
						r, ok := statusReasons[name]
						if !ok {
							t.Errorf("%s: metav1.%s is not in statusReasons of %s", dir, name, "troubleshooting_test.go")
						}
						reason = string(r)
					}
				}
				for _, c := range codes {
					a := strconv.Itoa(c)
					if reason != "" {
						a += " " + reason
					}
					if !seen[a] {
						seen[a] = true
						out = append(out, a)
					}
				}
				return true
			})
		}
	}
	return out
}

// fieldConstructors are the field package's error constructors and the
// type each writes after the field path ("Required value").
var fieldConstructors = map[string]field.ErrorType{
	"Required": field.ErrorTypeRequired, "Invalid": field.ErrorTypeInvalid, "Forbidden": field.ErrorTypeForbidden,
	"NotFound": field.ErrorTypeNotFound, "NotSupported": field.ErrorTypeNotSupported, "Duplicate": field.ErrorTypeDuplicate,
	"TooLong": field.ErrorTypeTooLong, "TooLongCharacters": field.ErrorTypeTooLong, "TooLongMaxLength": field.ErrorTypeTooLong,
	"TooMany": field.ErrorTypeTooMany, "TooFew": field.ErrorTypeTooFew, "TooShort": field.ErrorTypeTooShort,
	"InternalError": field.ErrorTypeInternal, "TypeInvalid": field.ErrorTypeTypeInvalid,
}

// fieldErrorTypes returns the types of the field errors dirs build, as
// they are printed ("Required value", "Not found").
func fieldErrorTypes(t *testing.T, dirs ...string) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for _, dir := range dirs {
		for _, f := range parseGoDir(t, dir) {
			pkg := importedAs(f, "k8s.io/apimachinery/pkg/util/validation/field")
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				name := selectorOf(call.Fun, pkg)
				if name == "" || name == "NewPath" {
					return true
				}
				typ, ok := fieldConstructors[name]
				if !ok {
					t.Errorf("%s: field.%s is not in fieldConstructors of troubleshooting_test.go", dir, name)
					return true
				}
				if s := typ.String(); !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
				return true
			})
		}
	}
	return out
}

// doctorCheckNames returns the check names doctor reports: the first
// argument of every fail("…", …) and pass("…", …).
func doctorCheckNames(t *testing.T, dir string) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for _, f := range parseGoDir(t, dir) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			if fn, ok := call.Fun.(*ast.Ident); !ok || (fn.Name != "fail" && fn.Name != "pass") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: a check named by %T, not a string literal; extend this test to read it", dir, call.Args[0])
				return true
			}
			v, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
			return true
		})
	}
	return out
}

// adapterSources returns the adapter's TypeScript sources under dir,
// less tests, declarations and anything built or installed.
func adapterSources(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "dist") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".ts") || strings.HasSuffix(path, ".d.ts") || strings.HasSuffix(path, ".test.ts") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Errorf("no TypeScript sources in %s", dir)
	}
	return out
}

// adapterMatches returns the first group of every match of re in the
// adapter's sources, each once, in a stable order.
func adapterMatches(t *testing.T, dir string, re *regexp.Regexp) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, src := range adapterSources(t, dir) {
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			seen[m[1]] = true
		}
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// adapterErrorCodes returns the values of the adapter's ErrorCodes object
// and any errorCode written as a literal elsewhere.
func adapterErrorCodes(t *testing.T, dir string) []string {
	t.Helper()
	block := regexp.MustCompile(`(?s)\bErrorCodes\s*=\s*\{(.*?)\}\s*as\s+const`)
	comment := regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	entry := regexp.MustCompile(`[A-Za-z_$][\w$]*\s*:\s*"([^"]+)"`)
	seen := map[string]bool{}
	found := false
	for _, src := range adapterSources(t, dir) {
		for _, b := range block.FindAllStringSubmatch(src, -1) {
			found = true
			for _, m := range entry.FindAllStringSubmatch(comment.ReplaceAllString(b[1], ""), -1) {
				seen[m[1]] = true
			}
		}
	}
	if !found {
		t.Errorf("%s: no `ErrorCodes = { … } as const` object; extend this test to read the adapter's error codes", dir)
	}
	for _, v := range adapterMatches(t, dir, regexp.MustCompile(`\berrorCode:\s*"([^"]+)"`)) {
		seen[v] = true
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}
