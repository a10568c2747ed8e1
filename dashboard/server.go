package dashboard

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/contract"
)

//go:embed web
var web embed.FS

// Server serves the runs page as the viewer: Kube is a client with the
// viewer's own credentials.
type Server struct {
	Kube kubernetes.Interface
	// Namespaces to show; empty shows every namespace, which needs the
	// right to list Jobs cluster-wide.
	Namespaces []string
	// ClaimNamespaces are read for claim Leases besides Namespaces: the
	// claim namespace of policy.concurrency.scope Cluster. A claim marks
	// only a run the viewer sees.
	ClaimNamespaces []string
	// Relay, when set, adds logs, results, costs and runs whose Job is
	// gone.
	Relay *Relay
	// Refresh is how often the live stream reads the cluster again.
	// Default 2s.
	Refresh time.Duration
	// Hosts are the Host headers the page may be asked by (the address it
	// listens on): any other is refused, so a web page that rebinds its
	// own DNS name to 127.0.0.1 cannot read the runs through the
	// viewer's browser.
	Hosts []string
	// Token, when set, is the page's session secret: a request must carry
	// it, as ?token= on the URL the command prints (which sets it as a
	// cookie) or as that cookie. The Host check stops other web pages,
	// not other users and processes of the machine, which reach loopback
	// as well.
	Token string

	mu      sync.Mutex
	mayLogs map[string]cachedBool

	// The latest snapshot, shared by the page's open streams (tabs), so
	// each refresh reads the cluster and the relay once.
	latest   sync.Mutex
	snap     []byte
	snapTime time.Time
}

type cachedBool struct {
	ok  bool
	err error // the check failed: asked again sooner
	exp time.Time
}

// Snapshot is what the page shows at one moment.
type Snapshot struct {
	Runs []Run `json:"runs"`
	// Notices say what the viewer could not see and why (a namespace
	// whose Jobs they may not list, a relay that did not answer).
	Notices []string `json:"notices,omitempty"`
	// Relay: logs and costs are available.
	Relay bool `json:"relay"`
}

// Handler is the page and its API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(web, "web")
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/runs", s.runs)
	mux.HandleFunc("GET /api/events", s.events)
	mux.HandleFunc("GET /api/costs", s.costs)
	mux.HandleFunc("GET /api/log", s.log)
	return s.guard(mux)
}

// guard refuses requests for another host, and without the session's
// token, and keeps the page's own resources the only ones it loads.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(s.Hosts) > 0 && !slices.Contains(s.Hosts, r.Host) {
			http.Error(w, fmt.Sprintf("host %q: this page answers only as %v (the address clipjob dashboard listens on)", r.Host, s.Hosts), http.StatusMisdirectedRequest)
			return
		}
		// A web page elsewhere can still make the viewer's browser send
		// requests it cannot read; each costs a read of the cluster as
		// the viewer. Browsers say where a request comes from.
		if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
			http.Error(w, "this page answers only its own requests (Sec-Fetch-Site "+site+")", http.StatusForbidden)
			return
		}
		if s.Token != "" {
			given := r.URL.Query().Get("token")
			if given == "" {
				if c, err := r.Cookie(tokenCookie); err == nil {
					given = c.Value
				}
			}
			if subtle.ConstantTimeCompare([]byte(given), []byte(s.Token)) != 1 {
				http.Error(w, "open the page at the URL clipjob dashboard printed: it carries the session's token", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: s.Token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		}
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

// tokenCookie holds the session's token in the viewer's browser.
const tokenCookie = "clipjob-dashboard"

// HostsFor are the Host headers a browser sends to addr (host:port as
// bound): the address itself, and localhost for a loopback address.
func HostsFor(addr string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return []string{addr}
	}
	hosts := []string{addr}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		hosts = append(hosts, net.JoinHostPort("localhost", port))
	}
	return hosts
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Snapshot reads what the viewer may see now.
func (s *Server) Snapshot(ctx context.Context) Snapshot {
	var snap Snapshot
	var src Sources
	scopes := s.Namespaces
	if len(scopes) == 0 {
		scopes = []string{metav1.NamespaceAll}
	}
	// A relay record is shown only where the viewer's Jobs were listed:
	// elsewhere a run whose Job exists would look gone.
	listed := map[string]bool{}
	for _, ns := range scopes {
		jobs, err := s.Kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelAgentID})
		if err != nil {
			snap.Notices = append(snap.Notices, listNotice("Jobs", ns, err))
			continue
		}
		listed[ns] = true
		src.Jobs = append(src.Jobs, jobs.Items...)
		src.Leases = append(src.Leases, s.claims(ctx, ns)...)
	}
	for _, ns := range s.ClaimNamespaces {
		src.Leases = append(src.Leases, s.claims(ctx, ns)...)
	}
	if s.Relay != nil {
		snap.Relay = true
		logged, err := s.Relay.Runs(ctx)
		if err != nil {
			snap.Notices = append(snap.Notices, err.Error())
		}
		unchecked := map[string]bool{}
		for _, rec := range logged {
			if !(listed[rec.Namespace] || listed[metav1.NamespaceAll]) || !s.inScope(rec.Namespace) {
				continue
			}
			may, err := s.checkLogs(ctx, rec.Namespace)
			if err != nil && !unchecked[rec.Namespace] {
				unchecked[rec.Namespace] = true
				snap.Notices = append(snap.Notices, fmt.Sprintf("checking whether you may read logs in namespace %s: %v; its runs' logs and costs are not shown", rec.Namespace, err))
			}
			if may {
				src.Logged = append(src.Logged, rec)
			}
		}
	}
	snap.Runs = Rows(src)
	if snap.Runs == nil {
		snap.Runs = []Run{}
	}
	return snap
}

// claims lists the claim Leases in ns. They show who holds an agent; a
// viewer who may not read Leases still sees the runs, without the mark.
func (s *Server) claims(ctx context.Context, ns string) []coordinationv1.Lease {
	leases, err := s.Kube.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: claim.Label + "=" + claim.KindAgentRun})
	if err != nil {
		return nil
	}
	return leases.Items
}

func listNotice(what, ns string, err error) string {
	where := "namespace " + ns
	fix := ""
	if ns == metav1.NamespaceAll {
		where = "every namespace"
		fix = "; name the namespaces you may read with --namespace"
	}
	if apierrors.IsForbidden(err) {
		return fmt.Sprintf("you may not list %s in %s, so none of its runs are shown%s", what, where, fix)
	}
	return fmt.Sprintf("listing %s in %s: %v", what, where, err)
}

func (s *Server) inScope(ns string) bool {
	return len(s.Namespaces) == 0 || slices.Contains(s.Namespaces, ns)
}

// mayReadLogs asks the API server whether the viewer may get pods/log in
// ns, as the relay asks for its own callers: the relay answers for the
// token's account, and the page shows no more than the viewer could read
// with kubectl logs. Answers are kept 30 s.
func (s *Server) mayReadLogs(ctx context.Context, ns string) bool {
	may, _ := s.checkLogs(ctx, ns)
	return may
}

// checkLogs is mayReadLogs with the error of a check that failed: kept
// 5 s, so a refresh over many runs of the namespace asks once.
func (s *Server) checkLogs(ctx context.Context, ns string) (bool, error) {
	s.mu.Lock()
	if c, ok := s.mayLogs[ns]; ok && time.Now().Before(c.exp) {
		s.mu.Unlock()
		return c.ok, c.err
	}
	s.mu.Unlock()
	review, err := s.Kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
		Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: ns, Verb: "get", Resource: "pods", Subresource: "log"}},
	}, metav1.CreateOptions{})
	answer := cachedBool{exp: time.Now().Add(30 * time.Second)}
	if err != nil {
		answer = cachedBool{err: err, exp: time.Now().Add(5 * time.Second)}
	} else {
		answer.ok = review.Status.Allowed
	}
	s.mu.Lock()
	if s.mayLogs == nil {
		s.mayLogs = map[string]cachedBool{}
	}
	s.mayLogs[ns] = answer
	s.mu.Unlock()
	return answer.ok, answer.err
}

func (s *Server) runs(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Snapshot(r.Context()))
}

// refresh is Refresh, or its default.
func (s *Server) refresh() time.Duration {
	if s.Refresh <= 0 {
		return 2 * time.Second
	}
	return s.Refresh
}

// events streams a snapshot whenever what the page shows changed.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	every := s.refresh()
	var last []byte
	lastWrite := time.Time{}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		data := s.shared(r.Context(), every)
		if r.Context().Err() != nil {
			return
		}
		var err error
		switch {
		case !bytes.Equal(data, last):
			_, err = fmt.Fprintf(w, "event: runs\ndata: %s\n\n", data)
			last, lastWrite = data, time.Now()
		case time.Since(lastWrite) > 15*time.Second:
			_, err = io.WriteString(w, ": keepalive\n\n") // through proxies that cut idle streams
			lastWrite = time.Now()
		}
		if err != nil {
			return
		}
		flusher.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// shared is the snapshot as JSON, read again when the one kept is older
// than half of every: tabs that ask within that share one reading.
func (s *Server) shared(ctx context.Context, every time.Duration) []byte {
	s.latest.Lock()
	defer s.latest.Unlock()
	if s.snap == nil || time.Since(s.snapTime) >= every/2 {
		// Not ended with the tab that asked: the others share it.
		read, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		s.snap, _ = json.Marshal(s.Snapshot(read))
		s.snapTime = time.Now()
	}
	return s.snap
}

// costs sums cost and tokens per agent and company over runs started in
// [from, until) (RFC 3339; either may be left out).
func (s *Server) costs(w http.ResponseWriter, r *http.Request) {
	var bounds [2]time.Time
	for i, name := range []string{"from", "until"} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"message": fmt.Sprintf("%s %q: want an RFC 3339 time such as 2026-11-28T00:00:00Z", name, v)})
			return
		}
		bounds[i] = t
	}
	writeJSON(w, http.StatusOK, map[string]any{"totals": Totals(s.Snapshot(r.Context()).Runs, bounds[0], bounds[1])})
}

// log follows one run's log through the relay, as its NDJSON stream
// from after the line numbered after. NDJSON rather than SSE: the page
// reads it with fetch and takes the lines in slices, yielding between
// them, where an EventSource hands a page every event of what arrived at
// once — thousands of lines of a long log, a stall.
func (s *Server) log(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns, run, job := q.Get("namespace"), q.Get("run"), q.Get("job")
	var after uint64
	if v := q.Get("after"); v != "" {
		var err error
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			http.Error(w, fmt.Sprintf("after %q: want the number of the last line the page has", v), http.StatusBadRequest)
			return
		}
	}
	if s.Relay == nil {
		http.Error(w, "no relay: start clipjob dashboard with --relay-url and --relay-token-file to read logs", http.StatusNotFound)
		return
	}
	if ns == "" || run == "" {
		http.Error(w, "namespace and run are required", http.StatusBadRequest)
		return
	}
	if !s.inScope(ns) || !s.mayReadLogs(r.Context(), ns) {
		http.Error(w, fmt.Sprintf("run %s/%s: not found, or you may not read logs in its namespace (needs get pods/log)", ns, run), http.StatusNotFound)
		return
	}
	// The relay's record must be of this namespace: a run id is a label
	// anyone may copy into another namespace, where the viewer's right
	// to read logs says nothing.
	rec, err := s.Relay.Run(r.Context(), run, job)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if rec == nil || rec.Namespace != ns {
		http.Error(w, fmt.Sprintf("run %s/%s: the relay has no log of it that you may read", ns, run), http.StatusNotFound)
		return
	}
	resp, err := s.Relay.Log(r.Context(), run, rec.JobUID, after)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Cache-Control"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			return
		}
	}
}
