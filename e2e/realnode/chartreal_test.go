package realnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/store"
)

// inClusterValues install the chart as an operator would, for agent
// namespace ns with the example Paperclip there as its source: its own
// certificates (selfManaged), the webhook (two replicas) and relay as
// Deployments from the image, here placed on the real node.
func inClusterValues(ns string) map[string]any {
	sel, tol := cluster.RealNodePlacement()
	selector := map[string]any{} // Helm's values are JSON: no typed maps
	for k, v := range sel {
		selector[k] = v
	}
	place := map[string]any{"nodeSelector": selector, "tolerations": []any{map[string]any{
		"key": tol[0].Key, "operator": string(tol[0].Operator), "effect": string(tol[0].Effect)}}}
	webhook := map[string]any{"replicas": 2}
	relayValues := map[string]any{"namespaces": []any{ns}}
	for k, v := range place {
		webhook[k], relayValues[k] = v, v
	}
	return map[string]any{
		"agentNamespaces": []any{ns},
		"config": map[string]any{"source": map[string]any{"namespace": ns, "deployment": "paperclip", "container": "paperclip"},
			"defaults": harness.RealNodeAgentDefaults()},
		"webhook": webhook,
		"relay":   relayValues,
	}
}

// chartRelease is the chart installed from its images as a release of
// its own, serving an agent namespace of its own beside the suite's
// install, so the tests that install one run in parallel with the rest.
type chartRelease struct {
	charts.Release
	// in is the agent namespace: its Jobs, pods and admission loop.
	in *harness.Install
}

// installRelease installs the chart as release clipjob-<name> (namespace
// clipjob-<name>-system) for agent namespace <name>-agents, values made
// by values for that namespace; it is removed when the test ends.
func installRelease(ctx context.Context, t *testing.T, name string, values func(ns string) map[string]any) *chartRelease {
	t.Helper()
	if _, err := harness.LoadClipjobImage(ctx, suite.cluster); err != nil {
		t.Fatal(err)
	}
	// The chart names its objects after a release whose name holds the
	// chart's (clipjob-pg-webhook), else release-clipjob-webhook.
	r := &chartRelease{Release: charts.Release{Name: "clipjob-" + name, Namespace: "clipjob-" + name + "-system"}}
	in, err := harness.NewAgentNamespace(ctx, suite.in, name+"-agents")
	if err != nil {
		t.Fatal(err)
	}
	r.in = in
	if _, err := suite.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	undo, err := harness.InstallRelease(ctx, suite.cluster, r.Release, values(in.Namespace), in.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		undo(ctx)
		for _, ns := range []string{in.Namespace, r.Namespace} {
			_ = suite.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		}
	})
	if err := harness.WaitAdmitting(ctx, suite.cs, in.BareJob(t, "e2e-chart-ready"), in.Namespace); err != nil {
		t.Fatal(err)
	}
	return r
}

// mutating names the release's mutating webhook configuration.
func (r *chartRelease) mutating() string { return r.Name + "-mutating" }

// waitAvailable waits until the release's Deployment name is available.
func (r *chartRelease) waitAvailable(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if err := harness.WaitDeploymentAvailable(ctx, suite.cs, r.Namespace, name); err != nil {
		t.Fatal(err)
	}
}

// inClusterRelay reaches the chart's relay through its Service, trusting
// the CA the webhook injected (selfManaged issues both certificates).
func (r *chartRelease) inClusterRelay(ctx context.Context, t *testing.T) (base string, hc *http.Client) {
	t.Helper()
	svc, err := suite.cs.CoreV1().Services(r.Namespace).Get(ctx, r.Name+"-relay", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, r.mutating(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(m.Webhooks[0].ClientConfig.CABundle)
	serverName := fmt.Sprintf("%s.%s.svc", svc.Name, svc.Namespace)
	hc = &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serverName}}}
	return "https://" + svc.Spec.ClusterIP + ":443", hc
}

// relayReader reads the chart's relay through its Service, as a client
// does, with the token of a ServiceAccount that may read the agents' logs.
type relayReader struct {
	base, token string
	hc          *http.Client
}

func (r *chartRelease) newRelayReader(ctx context.Context, t *testing.T) *relayReader {
	t.Helper()
	base, hc := r.inClusterRelay(ctx, t)
	token, err := harness.ServiceAccountToken(ctx, suite.cluster, r.in.Namespace, "paperclip-server", harness.LogReaderRules, relay.DefaultTokenAudience)
	if err != nil {
		t.Fatal(err)
	}
	return &relayReader{base: base, token: token, hc: hc}
}

// get answers path's status and body; an unreachable relay answers 0 and
// the error. Each request has 20 s: the Service may still send one to a
// relay pod that is gone.
func (r *relayReader) get(ctx context.Context, path string) (int, []byte) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := r.hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// waitRun waits until the run the relay serves satisfies ok.
func (r *relayReader) waitRun(ctx context.Context, t *testing.T, name string, ok func(*store.Run) bool) *store.Run {
	t.Helper()
	var run *store.Run
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		code, body := r.get(ctx, "/v1/runs/"+name)
		var got store.Run
		if code != http.StatusOK || json.Unmarshal(body, &got) != nil {
			return false, nil
		}
		run = &got
		return ok(run), nil
	})
	if err != nil {
		code, body := r.get(ctx, "/v1/runs/"+name)
		t.Fatalf("the chart's relay never served run %s as waited for: %v (%d %.300s)", name, err, code, body)
	}
	return run
}

// log is the run's stored log, line by line.
func (r *relayReader) log(ctx context.Context, t *testing.T, name string) []string {
	t.Helper()
	code, body := r.get(ctx, "/v1/runs/"+name+"/log")
	if code != http.StatusOK {
		t.Fatalf("log of %s: %d %.300s", name, code, body)
	}
	return strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
}

// TestChartRunsOnTheRealNode: the chart installed for real — the webhook
// (two replicas) and the relay as Deployments from `make image`'s image,
// with the chart's RBAC, Services, self-issued certificates and probes —
// admits a bare Job that runs the fake agent on the real kubelet with the
// floor held; the relay in the cluster collects its log through the
// kubelet and serves it, each line once, with its result; and a rolling
// restart of the webhook while a load loop creates agent Jobs fails none.
func TestChartRunsOnTheRealNode(t *testing.T) {
	requireRealNode(t)
	t.Parallel() // a release and an agent namespace of its own
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := installRelease(ctx, t, "real", inClusterValues)

	name := "e2e-chart-real"
	if _, err := suite.cs.BatchV1().Jobs(r.in.Namespace).Create(ctx, realJobIn(t, r.in, name, "probe=1 lines=30 rate=50 burst=200"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the chart's webhook refused the bare Job: %v", err)
	}
	job := r.in.WaitJobEnded(ctx, t, name, 3*time.Minute)
	if job.Status.Succeeded != 1 {
		t.Fatalf("Job %s: %+v", name, job.Status)
	}
	m, err := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, r.mutating(), metav1.GetOptions{})
	if err != nil || m.Webhooks[0].ClientConfig.Service == nil || m.Webhooks[0].ClientConfig.URL != nil {
		t.Fatalf("the mutating webhook is not the chart's Service: %v %+v", err, m)
	}
	if job.Annotations[contract.AnnotationTemplateHash] == "" {
		t.Errorf("the Job was not mutated by the chart's webhook: annotations %v", job.Annotations)
	}
	pod := r.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
	want := kubeletLogIn(ctx, t, r.in.Namespace, pod.Name)
	checkFloor(t, pod, want[1])

	reader := r.newRelayReader(ctx, t)
	run := reader.waitRun(ctx, t, name, func(s *store.Run) bool { return s.Done })
	harness.ExactlyOnce(t, reader.log(ctx, t, name), want)
	if run.Result == nil || run.Result.Outcome != "succeeded" || run.Result.CostUSD == nil {
		t.Errorf("the chart's relay parsed %s", mustJSON(run.Result))
	}

	r.rollingRestartUnderLoad(ctx, t)
}

// rollingRestartUnderLoad restarts the webhook Deployment (as `helm
// upgrade` with a changed pod template does) while admissionLoop creates
// agent Jobs without pause; every create must be admitted mutated.
func (r *chartRelease) rollingRestartUnderLoad(ctx context.Context, t *testing.T) {
	t.Helper()
	stop := make(chan struct{})
	ok, failed, lastErr, done := r.in.AdmissionLoop(ctx, t, "e2e-chart-rollout", stop)
	waitAdmitted(ctx, t, ok, 20)
	name := r.Name + "-webhook"
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e.clipjob.paperclip.io/restarted":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := suite.cs.AppsV1().Deployments(r.Namespace).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitAvailable(ctx, t, name)
	// Until the old pods are gone (their shutdown delay runs out under
	// load too), and then some more creates.
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := suite.cs.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
		return err == nil && len(pods.Items) == 2, nil
	})
	if err != nil {
		t.Errorf("the old webhook pods never went: %v", err)
	}
	waitAdmitted(ctx, t, ok, ok.Load()+20)
	close(stop)
	<-done
	t.Logf("rolling restart under load: %d admitted, %d failed", ok.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Errorf("%d of %d creates failed (or were not mutated) during the rollout; last: %v", failed.Load(), ok.Load()+failed.Load(), lastErr.Load())
	}
	if ok.Load() < 20 {
		t.Errorf("only %d creates ran during the rollout: the load was too thin to show anything", ok.Load())
	}
}

// waitAdmitted waits until the admission loop has had n creates admitted,
// so what a test does under load happens under load however slow the
// machine is.
func waitAdmitted(ctx context.Context, t *testing.T, ok *atomic.Int64, n int64) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return ok.Load() >= n, nil
	}); err != nil {
		t.Fatalf("the admission loop had %d creates admitted, waiting for %d: %v", ok.Load(), n, err)
	}
}
