package realnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/store"
)

// inClusterValues install the chart as an operator would: its own
// certificates (selfManaged), the webhook and relay as Deployments from
// the image, here placed on the real node.
func inClusterValues() map[string]any {
	sel, tol := cluster.RealNodePlacement()
	selector := map[string]any{} // Helm's values are JSON: no typed maps
	for k, v := range sel {
		selector[k] = v
	}
	place := map[string]any{"nodeSelector": selector, "tolerations": []any{map[string]any{
		"key": tol[0].Key, "operator": string(tol[0].Operator), "effect": string(tol[0].Effect)}}}
	webhook := map[string]any{"replicas": 2}
	relayValues := map[string]any{}
	for k, v := range place {
		webhook[k], relayValues[k] = v, v
	}
	return map[string]any{
		"agentNamespaces": harness.AgentNamespaces,
		"config":          map[string]any{"tenantNamespaces": harness.TenantNamespaces},
		"webhook":         webhook,
		"relay":           relayValues,
	}
}

// installInCluster replaces the suite's host-process webhook registration
// with the chart's own install, and puts it back when the test ends.
func installInCluster(ctx context.Context, t *testing.T, values map[string]any) *charts.Rendered {
	t.Helper()
	if _, err := harness.LoadClipjobImage(ctx, suite.cluster); err != nil {
		t.Fatal(err)
	}
	r, err := charts.Render(harness.Release, values)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(suite.cluster.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The relay's store: a volume on the real node for its claim.
	storeDir := filepath.Join(suite.cluster.Dir, "relay-store")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(storeDir, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	relayName := harness.Release.Name + "-relay"
	pv := harness.HostPathVolume("clipjob-relay-store", storeDir, corev1.ReadWriteOnce, harness.Release.Namespace, relayName)
	if err := cl.Create(ctx, pv); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The host registration goes first: the chart's configurations call
	// its Service, not a URL, and are created whole.
	deleteWebhookConfigurations(ctx, t)
	var created []client.Object
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for i := len(created) - 1; i >= 0; i-- {
			o := created[i]
			switch o.GetObjectKind().GroupVersionKind().Kind {
			case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Namespace",
				"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
				continue // the suite's RBAC and claim policy stay
			}
			_ = cl.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationForeground))
		}
		_ = cl.Delete(ctx, pv)
		// The certificates' Secrets too: the next install (another
		// certificates mode) must not find this one's.
		for _, secret := range []string{"-ca", "-webhook-tls", "-relay-tls"} {
			_ = suite.cs.CoreV1().Secrets(harness.Release.Namespace).Delete(ctx, harness.Release.Name+secret, metav1.DeleteOptions{})
		}
		_ = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			pods, err := suite.cs.CoreV1().Pods(harness.Release.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + harness.Release.Name})
			return err == nil && len(pods.Items) == 0, nil
		})
		deleteWebhookConfigurations(ctx, t)
		if err := suite.in.Register(ctx, harness.RegisterOptions{Addr: suite.in.Webhook.Addr}); err != nil {
			t.Errorf("restoring the suite's webhook registration: %v", err)
		}
	})
	for _, o := range r.Objects {
		err := cl.Create(ctx, o)
		if apierrors.IsAlreadyExists(err) {
			continue // the suite applied the chart's RBAC and claim policy
		}
		if err != nil {
			t.Fatalf("creating the chart's %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		created = append(created, o)
	}
	for _, d := range []string{harness.Release.Name + "-webhook", relayName} {
		waitDeploymentAvailable(ctx, t, d)
	}
	waitCABundle(ctx, t, harness.MutatingWebhookName, harness.ValidatingWebhookName)
	waitAdmittingIn(ctx, t, suite.in.Namespace)
	return r
}

// waitAdmittingIn waits until an agent Job in ns is admitted mutated
// (harness.WaitAdmitting).
func waitAdmittingIn(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	if err := harness.WaitAdmitting(ctx, suite.cs, suite.in.BareJob(t, "e2e-chart-ready"), ns); err != nil {
		t.Fatal(err)
	}
}

func deleteWebhookConfigurations(ctx context.Context, t *testing.T) {
	t.Helper()
	a := suite.cs.AdmissionregistrationV1()
	for _, err := range []error{
		a.MutatingWebhookConfigurations().Delete(ctx, harness.MutatingWebhookName, metav1.DeleteOptions{}),
		a.ValidatingWebhookConfigurations().Delete(ctx, harness.ValidatingWebhookName, metav1.DeleteOptions{}),
	} {
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// waitDeploymentAvailable waits until the suite's release's Deployment
// name is available.
func waitDeploymentAvailable(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if err := harness.WaitDeploymentAvailable(ctx, suite.cs, harness.Release.Namespace, name); err != nil {
		t.Fatal(err)
	}
}

func waitCABundle(ctx context.Context, t *testing.T, mutating, validating string) {
	t.Helper()
	if err := harness.WaitCABundle(ctx, suite.cs, mutating, validating); err != nil {
		t.Fatal(err)
	}
}

// inClusterRelay reaches the chart's relay through its Service, trusting
// the CA the webhook injected (selfManaged issues both certificates).
func inClusterRelay(ctx context.Context, t *testing.T) (base string, hc *http.Client) {
	t.Helper()
	svc, err := suite.cs.CoreV1().Services(harness.Release.Namespace).Get(ctx, harness.Release.Name+"-relay", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, harness.MutatingWebhookName, metav1.GetOptions{})
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

func newRelayReader(ctx context.Context, t *testing.T) *relayReader {
	t.Helper()
	base, hc := inClusterRelay(ctx, t)
	token, err := harness.ServiceAccountToken(ctx, suite.cluster, suite.in.Namespace, "paperclip-server", harness.LogReaderRules, relay.DefaultTokenAudience)
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	installInCluster(ctx, t, inClusterValues())

	name := "e2e-chart-real"
	if _, err := suite.cs.BatchV1().Jobs(suite.in.Namespace).Create(ctx, realJob(t, name, "probe=1 lines=30 rate=50 burst=200"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the chart's webhook refused the bare Job: %v", err)
	}
	job := suite.in.WaitJobEnded(ctx, t, name, 3*time.Minute)
	if job.Status.Succeeded != 1 {
		t.Fatalf("Job %s: %+v", name, job.Status)
	}
	m, err := suite.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, harness.MutatingWebhookName, metav1.GetOptions{})
	if err != nil || m.Webhooks[0].ClientConfig.Service == nil || m.Webhooks[0].ClientConfig.URL != nil {
		t.Fatalf("the mutating webhook is not the chart's Service: %v %+v", err, m)
	}
	if job.Annotations[contract.AnnotationTemplateHash] == "" {
		t.Errorf("the Job was not mutated by the chart's webhook: annotations %v", job.Annotations)
	}
	pod := suite.in.WaitPod(ctx, t, name, func(*corev1.Pod) bool { return true })
	want := kubeletLog(ctx, t, pod.Name)
	checkFloor(t, pod, want[1])

	reader := newRelayReader(ctx, t)
	run := reader.waitRun(ctx, t, name, func(r *store.Run) bool { return r.Done })
	harness.ExactlyOnce(t, reader.log(ctx, t, name), want)
	if run.Result == nil || run.Result.Outcome != "succeeded" || run.Result.CostUSD == nil {
		t.Errorf("the chart's relay parsed %s", mustJSON(run.Result))
	}

	rollingRestartUnderLoad(ctx, t)
}

// rollingRestartUnderLoad restarts the webhook Deployment (as `helm
// upgrade` with a changed pod template does) while admissionLoop creates
// agent Jobs without pause; every create must be admitted mutated.
func rollingRestartUnderLoad(ctx context.Context, t *testing.T) {
	t.Helper()
	stop := make(chan struct{})
	ok, failed, lastErr, done := suite.in.AdmissionLoop(ctx, t, "e2e-chart-rollout", stop)
	waitAdmitted(ctx, t, ok, 20)
	name := harness.Release.Name + "-webhook"
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e.clipjob.paperclip.io/restarted":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := suite.cs.AppsV1().Deployments(harness.Release.Namespace).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitDeploymentAvailable(ctx, t, name)
	// Until the old pods are gone (their shutdown delay runs out under
	// load too), and then some more creates.
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := suite.cs.CoreV1().Pods(harness.Release.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
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
