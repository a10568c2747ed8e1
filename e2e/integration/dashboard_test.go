package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the viewer's zone, whatever the machine has

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/chromedp/chromedp"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/dashboard"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// ScreenshotsEnv names the directory the page test writes its
// screenshots to (make dashboard-screenshots: docs/images/dashboard).
const screenshotsEnv = "CLIPJOB_DASHBOARD_SCREENSHOTS"

// runsViewerRules are what a person watching an install's runs holds in
// its namespace: read Jobs and claim Leases, and read logs (kubectl logs).
var runsViewerRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list"}},
	{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
}

// clientWithToken is a client of the API server holding only token.
func clientWithToken(token string) kubernetes.Interface {
	rc := rest.AnonymousClientConfig(suite.cluster.Config)
	rc.BearerToken = token
	return kubernetes.NewForConfigOrDie(rc)
}

// serveRunsPage serves the runs page as the client's user, for namespace,
// with the install's relay read with relayToken, on loopback as
// clipjob dashboard does, and returns its URL.
func serveRunsPage(t *testing.T, kube kubernetes.Interface, namespace string, r *harness.Relay, relayToken string) string {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "relay-token")
	if err := os.WriteFile(tokenFile, []byte(relayToken), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String() + "/"
	token := strings.ReplaceAll(t.Name(), "/", "-") + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	pageTokens.Store(base, token)
	s := &dashboard.Server{Kube: kube, Namespaces: []string{namespace}, Refresh: 500 * time.Millisecond,
		Hosts: dashboard.HostsFor(ln.Addr().String()), Token: token,
		Relay: &dashboard.Relay{URL: "https://" + r.APIAddr, TokenFile: tokenFile, HTTP: r.CA.HTTPClient(), Limit: 1000}}
	srv := &http.Server{Handler: s.Handler()}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { srv.Close() })
	return base
}

// pageTokens are the runs pages' session tokens, by base URL.
var pageTokens sync.Map

// withToken is a runs page's URL as the command prints it: with the
// session's token, which the page then keeps as a cookie.
func withToken(base string) string {
	token, _ := pageTokens.Load(base)
	return base + "?token=" + token.(string)
}

// pageGet is a GET of path on the runs page at base, with its session's
// token.
func pageGet(base, path string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		return nil, err
	}
	token, _ := pageTokens.Load(base)
	req.AddCookie(&http.Cookie{Name: "clipjob-dashboard", Value: token.(string)})
	return http.DefaultClient.Do(req)
}

// pageRuns is GET /api/runs of a runs page.
func pageRuns(t *testing.T, url string) dashboard.Snapshot {
	t.Helper()
	resp, err := pageGet(url, "api/runs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var snap dashboard.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

func findRun(snap dashboard.Snapshot, key string) *dashboard.Run {
	for i := range snap.Runs {
		if snap.Runs[i].Key == key {
			return &snap.Runs[i]
		}
	}
	return nil
}

// rowJS reads a run's row on the page: its state and its Details cell.
func rowJS(key string) string {
	k, _ := json.Marshal(key)
	return `(() => { const r = document.querySelector('#runs tr[data-key=' + CSS.escape(` + string(k) + `) + ']');
		return r ? {state: r.dataset.state, details: r.cells[8].textContent, started: r.cells[4].textContent} : null })()`
}

type row struct{ State, Details, Started string }

// TestRunsPageInABrowser: the runs page, served as a viewer with the
// rights of kubectl get jobs and kubectl logs in one namespace, driven in
// headless Chromium against the real API server, webhook and relay. A
// queued run shows its position and the run it waits behind, then moves
// to running when the agent is free, without a reload; a run clipjob
// refused at its start shows why; a running run's lines appear in order
// as the agent writes them, and search finds them; a run past its Job's
// deadline shows it timed out; a link's filters show only their runs; a
// run whose Job is
// gone stays with its cost. A viewer without rights in the namespace —
// even handed the relay's token — sees none of its runs and none of its
// logs.
func TestRunsPageInABrowser(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	shots := os.Getenv(screenshotsEnv)
	if shots != "" {
		if err := os.MkdirAll(shots, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, completed := in.CompiledMode(ctx, t, "policy:\n  concurrency:\n    mode: Queue\n    maxQueued: 1\n")
	r, relayToken, _ := in.Relay(t)
	viewerToken, err := harness.ServiceAccountToken(ctx, suite.cluster, in.Namespace, "runs-viewer", runsViewerRules)
	if err != nil {
		t.Fatal(err)
	}
	outsiderToken, err := harness.ServiceAccountToken(ctx, suite.cluster, in.Namespace, "runs-outsider", nil)
	if err != nil {
		t.Fatal(err)
	}
	viewer := serveRunsPage(t, clientWithToken(viewerToken), in.Namespace, r, relayToken)
	outsider := serveRunsPage(t, clientWithToken(outsiderToken), in.Namespace, r, relayToken)

	// A run of another agent whose Job's deadline passes: timed out.
	deadline := in.BareJob(t, "e2e-page-deadline")
	deadline.Spec.ActiveDeadlineSeconds = ptr.To[int64](3)
	in.CreateJob(ctx, t, deadline)

	const agent = "agent-runs-page"
	first := in.BareJob(t, "e2e-page-first")
	first.Labels[contract.LabelAgentID] = agent
	in.CreateJob(ctx, t, first)
	in.WaitStarted(ctx, t, first.Name)
	pod := in.WaitPod(ctx, t, first.Name, harness.Running)
	podLog, err := suite.cluster.PodLog(ctx, in.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the queue's order is by creation, to the second
	next := in.BareJob(t, "e2e-page-next")
	next.Labels[contract.LabelAgentID] = agent
	in.CreateJob(ctx, t, next)
	time.Sleep(1100 * time.Millisecond)
	// A run stored queued without a webhook call (dressed as complete)
	// beyond maxQueued: the claim controller refuses it at its start.
	review, err := suite.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refused := harness.DressedAsComplete(completed, "e2e-page-refused")
	refused.Labels[contract.LabelAgentID], refused.Spec.Template.Labels[contract.LabelAgentID] = agent, agent
	refused.Annotations[contract.AnnotationCreatedBy] = review.Status.UserInfo.Username
	in.CreateJob(ctx, t, refused)
	var refusal string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		refusal = getJob(in, ctx, t, refused.Name).Annotations[contract.AnnotationQueueError]
		return refusal != "", nil
	})
	if err != nil {
		t.Fatalf("the run beyond maxQueued was not refused by the claim controller: %v", err)
	}
	firstKey, nextKey, refusedKey := in.Namespace+"/"+first.Name, in.Namespace+"/"+next.Name, in.Namespace+"/"+refused.Name

	// The viewer's page, in the viewer's time zone.
	const zone = "Asia/Kolkata"
	b := harness.NewBrowser(t, 1280, 900, zone)
	// Opened as the command prints it (the session's token, kept as a
	// cookie for every later request the page makes), then by its links.
	b.Do(chromedp.Navigate(withToken(viewer)))
	b.Do(chromedp.Navigate(viewer + "#run=" + nextKey))
	b.Do(chromedp.Evaluate[chromedp.Void](`window.sameDocument = true`))
	got := harness.Wait(b, "the queued run with its place and the run it waits behind", rowJS(nextKey), func(r *row) bool {
		return r != nil && r.State == "queued" && strings.Contains(r.Details, "#1 in queue, behind "+first.Name)
	})
	t.Logf("queued: %+v", got)
	harness.Wait(b, "the refused run with clipjob's reason", rowJS(refusedKey), func(r *row) bool {
		return r != nil && r.State == "refused" && r.Details == refusal
	})
	if !strings.Contains(refusal, string(contract.CauseQueueFull)) {
		t.Errorf("the refusal %q does not name %s", refusal, contract.CauseQueueFull)
	}
	harness.Wait(b, "the run past its deadline timed out, saying so", rowJS(in.Namespace+"/"+deadline.Name), func(r *row) bool {
		return r != nil && r.State == "timed_out" && strings.Contains(r.Details, "DeadlineExceeded")
	})
	running := harness.Wait(b, "the first run running", rowJS(firstKey), func(r *row) bool { return r != nil && r.State == "running" })
	// Times are the viewer's: the run's start as read in their zone.
	kolkata, _ := time.LoadLocation(zone)
	startedAt := getJob(in, ctx, t, first.Name).Status.StartTime.In(kolkata)
	if !strings.Contains(running.Started, startedAt.Format("3:04:05")) {
		t.Errorf("the first run's start %q is not shown in the viewer's zone %s (%s)", running.Started, zone, startedAt.Format("3:04:05 PM"))
	}
	b.Screenshot(shots, "queued-and-refused")
	// Filters: a link with a state shows only the runs in it.
	b.Do(chromedp.Navigate(viewer + "#state=refused&agent=" + agent))
	harness.Wait(b, "only the refused run under the filter", `Array.from(document.querySelectorAll('#runs tbody tr')).map(r => r.dataset.key)`,
		func(keys []string) bool { return len(keys) == 1 && keys[0] == refusedKey })

	// The running run's lines appear in order as the agent writes them.
	b.Do(chromedp.Navigate(viewer + "#run=" + firstKey))
	lines := []string{harness.ClaudeInit, "reading the repository", "found the needle in pkg/foo", "running the tests", harness.ClaudeResult("all done")}
	logLines := `Array.from(document.querySelectorAll('#log .line')).map(d => d.querySelector('.text').textContent)`
	for i, l := range lines {
		if err := podLog.Write(l); err != nil {
			t.Fatal(err)
		}
		harness.Wait(b, "line "+l, logLines, func(shown []string) bool { return len(shown) == i+1 && shown[i] == l })
	}
	// Search, from the keyboard: / focuses it.
	b.Do(chromedp.KeyEvent("/"), chromedp.KeyEvent("needle"))
	harness.Wait(b, "only the line that matches the search", logLines, func(shown []string) bool {
		return len(shown) == 1 && shown[0] == lines[2]
	})
	b.Screenshot(shots, "log")

	// The first run ends: the queued one starts, live.
	in.FinishRun(ctx, t, first.Name, "0")
	harness.Wait(b, "the queued run running once its agent was free", rowJS(nextKey), func(r *row) bool { return r != nil && r.State == "running" })
	harness.Wait(b, "the first run succeeded", rowJS(firstKey), func(r *row) bool { return r != nil && r.State == "succeeded" })
	var same bool
	if raw, err := b.Eval(`window.sameDocument === true`); err != nil || json.Unmarshal(raw, &same) != nil || !same {
		t.Errorf("the page was reloaded to show the change (%v)", err)
	}

	// Keyboard: j moves to a run, Enter opens it.
	b.Do(chromedp.KeyEvent("\x1b"), chromedp.KeyEvent("\x1b"), chromedp.KeyEvent("j"), chromedp.KeyEvent("\r"))
	harness.Wait(b, "a run opened from the keyboard", `location.hash`, func(h string) bool { return strings.Contains(h, "run=") })

	// On a phone the runs fit the width: nothing scrolls sideways.
	b.Do(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Navigate(viewer))
	harness.Wait(b, "the runs on a phone's width", `({rows: document.querySelectorAll('#runs tbody tr').length, wide: document.documentElement.scrollWidth - window.innerWidth})`,
		func(v struct{ Rows, Wide int }) bool { return v.Rows >= 3 && v.Wide <= 0 })
	harness.Wait(b, "the costs on a phone", `document.querySelectorAll('#costs tbody tr').length`, func(n int) bool { return n > 0 })
	b.Screenshot(shots, "phone")

	// Its Job gone, the run stays, with its result and cost.
	if err := suite.cs.BatchV1().Jobs(in.Namespace).Delete(ctx, first.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		run := findRun(pageRuns(t, viewer), firstKey)
		return run != nil && run.JobGone && run.State == "succeeded" && run.CostUSD != nil && *run.CostUSD == 0.42 && run.Session == "sess-e2e", nil
	})
	if err != nil {
		t.Errorf("the finished run whose Job is gone is not shown with its result: %+v", findRun(pageRuns(t, viewer), firstKey))
	}
	// Its log too, read whole, through the page.
	logResp, err := pageGet(viewer, "api/log?namespace="+in.Namespace+"&run="+first.Name)
	if err != nil {
		t.Fatal(err)
	}
	var gotLines []string
	var ended bool
	for dec := json.NewDecoder(logResp.Body); ; {
		var ev struct{ Type, Line string }
		if dec.Decode(&ev) != nil {
			break
		}
		switch ev.Type {
		case "line":
			gotLines = append(gotLines, ev.Line)
		case "end":
			ended = true
		}
		if ended {
			break
		}
	}
	logResp.Body.Close()
	if !ended || strings.Join(gotLines, "\n") != strings.Join(lines, "\n") {
		t.Errorf("the log of the run whose Job is gone, through the page: ended %v, lines %q", ended, gotLines)
	}

	// Costs over a period: the hour around the run counts it, the next
	// hour does not.
	now := time.Now().UTC()
	for _, c := range []struct {
		from, until time.Time
		want        float64
	}{{now.Add(-time.Hour), now.Add(time.Hour), 0.42}, {now.Add(time.Hour), now.Add(2 * time.Hour), 0}} {
		resp, err := pageGet(viewer, "api/costs?from="+c.from.Format(time.RFC3339)+"&until="+c.until.Format(time.RFC3339))
		if err != nil {
			t.Fatal(err)
		}
		var costs struct{ Totals []dashboard.Total }
		_ = json.NewDecoder(resp.Body).Decode(&costs)
		resp.Body.Close()
		var company float64
		for _, total := range costs.Totals {
			if total.Agent == "" && total.Company == first.Labels[contract.LabelCompanyID] {
				company = total.CostUSD
			}
		}
		if company != c.want {
			t.Errorf("costs from %s until %s: the company's total %v, want %v (%+v)", c.from, c.until, company, c.want, costs.Totals)
		}
	}

	// The outsider, handed the relay's token, still sees nothing of the
	// namespace: not its Jobs (RBAC), not the relay's runs or logs (they
	// may not get pods/log there).
	snap := pageRuns(t, outsider)
	if len(snap.Runs) != 0 || len(snap.Notices) == 0 || !strings.Contains(snap.Notices[0], "may not list Jobs in namespace "+in.Namespace) {
		t.Errorf("a viewer without rights in %s: runs %d, notices %q", in.Namespace, len(snap.Runs), snap.Notices)
	}
	logResp, err = pageGet(outsider, "api/log?namespace="+in.Namespace+"&run="+next.Name)
	if err != nil {
		t.Fatal(err)
	}
	logResp.Body.Close()
	if logResp.StatusCode != http.StatusNotFound {
		t.Errorf("a viewer without rights read a run's log: %s", logResp.Status)
	}
	o := harness.NewBrowser(t, 1280, 900, zone)
	o.Do(chromedp.Navigate(withToken(outsider)))
	shown := harness.Wait(o, "the outsider's page, live, with a notice", `({live: document.getElementById('live').textContent, rows: document.querySelectorAll('#runs tbody tr').length, notices: document.getElementById('notices').textContent})`,
		func(v struct {
			Live, Notices string
			Rows          int
		}) bool {
			return v.Live == "live" && v.Notices != ""
		})
	if shown.Rows != 0 || !strings.Contains(shown.Notices, "may not list Jobs") {
		t.Errorf("the outsider's page shows %d runs, notices %q", shown.Rows, shown.Notices)
	}
	o.Screenshot(shots, "no-rights")
}
