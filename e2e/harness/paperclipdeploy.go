package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/internal/ociimage"
)

// PaperclipInCluster is Paperclip as operators deploy it, on the real
// node: its image (`make paperclip-image`) as the Deployment "paperclip"
// with its home on a ReadWriteMany claim at /paperclip and its own
// ServiceAccount bound to the Role of the adapter's README, and clipjob
// from its chart as a release serving that namespace, with the Deployment
// as the source it completes agent Jobs from. The suite's test of it and
// `make demo` both start it with DeployPaperclip.
type PaperclipInCluster struct {
	// Namespace holds the server and its agents' runs.
	Namespace string
	// Release is clipjob's, serving Namespace.
	Release charts.Release
	// Image is the server's (and so its agents') image.
	Image string
	// Home is the directory of the real node behind the home's claim.
	Home string
	// Claim is the home's PersistentVolumeClaim.
	Claim string
	// ServiceAccount is the server's.
	ServiceAccount string
	// Pod is the server's pod; Server its API, reached by port-forward.
	Pod    string
	Server *Paperclip

	c           *cluster.Cluster
	cs          kubernetes.Interface
	stopForward func()
	undo        []func(context.Context) // newest last
}

// PaperclipDeployment is the name of the server's Deployment, and its
// container's.
const PaperclipDeployment = "paperclip"

// paperclipServerLabels select the server's pods (the chart's
// networkPolicy.paperclipServer default).
var paperclipServerLabels = map[string]string{"app": "paperclip-server"}

// DeployPaperclip starts Paperclip and clipjob in namespace ns of c's real
// node, clipjob as release rel with the chart's values (nil:
// PaperclipInClusterValues(ns)), and returns once the server answers
// healthy and the release admits agent Jobs there. step, when set, hears
// each step as it is done. On an error what was made is undone.
func DeployPaperclip(ctx context.Context, c *cluster.Cluster, ns string, rel charts.Release, values map[string]any, step func(string)) (_ *PaperclipInCluster, err error) {
	if step == nil {
		step = func(string) {}
	}
	if values == nil {
		values = PaperclipInClusterValues(ns)
	}
	p := &PaperclipInCluster{Namespace: ns, Release: rel, Claim: "paperclip-home", c: c, cs: c.Clientset()}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	cs := p.cs

	// The two images side by side: Paperclip's (cached by its inputs) and
	// clipjob's.
	paperclipImage := make(chan error, 1)
	go func() {
		var err error
		p.Image, err = LoadPaperclipImage(ctx, c)
		paperclipImage <- err
	}()
	defer func() {
		if paperclipImage != nil {
			<-paperclipImage // not left writing p.Image
		}
	}()
	if _, err := LoadClipjobImage(ctx, c); err != nil {
		return nil, err
	}
	step("clipjob's image is on the node")

	for _, name := range []string{ns, rel.Namespace} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		p.onClose(func(ctx context.Context) { _ = cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	undo, err := InstallRelease(ctx, c, rel, values, ns)
	if err != nil {
		return nil, err
	}
	p.onClose(undo)
	step(fmt.Sprintf("clipjob is installed from its chart as release %s in %s, serving %s", rel.Name, rel.Namespace, ns))
	relayName := rel.Name + "-relay"
	relaySvc, err := cs.CoreV1().Services(rel.Namespace).Get(ctx, relayName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}

	// What the adapter's README has an operator do on Paperclip's side:
	// the Role bound to the server's ServiceAccount. clipjob's CA bundle
	// beside the server is the chart's to publish (the ConfigMap
	// clipjob-ca): the server's pod mounts it, so this test fails if it
	// is not there or does not trust the relay.
	if p.ServiceAccount, err = ApplyPaperclipServerRBAC(ctx, cs, ns); err != nil {
		return nil, err
	}
	if err := waitPublishedCA(ctx, cs, ns, rel); err != nil {
		return nil, err
	}
	// The secret the agents' callback tokens are signed with, as an
	// operator keeps it: in a Secret, handed to the server's env.
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "paperclip"},
		StringData: map[string]string{"agent-jwt-secret": hex.EncodeToString(secret)}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}

	// Paperclip's home: a ReadWriteMany claim, here a directory of the
	// real node, for uid 1000.
	p.Home = filepath.Join(c.Dir, ns+"-home")
	if err := os.MkdirAll(p.Home, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(p.Home, SharedUID, SharedGID); err != nil {
		return nil, err
	}
	if err := os.Chmod(p.Home, 0o775|os.ModeSetgid); err != nil {
		return nil, err
	}
	pv, err := cs.CoreV1().PersistentVolumes().Create(ctx, HostPathVolume(ns+"-home", p.Home, corev1.ReadWriteMany, ns, p.Claim), metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	p.onClose(func(ctx context.Context) {
		_ = cs.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
	})
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: p.Claim},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr.To(""), VolumeName: pv.Name,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}

	err, paperclipImage = <-paperclipImage, nil
	if err != nil {
		return nil, err
	}
	step("Paperclip's image (with clipjob's adapter registered at start) is on the node: " + p.Image)
	relayHost := fmt.Sprintf("%s.%s.svc", relayName, rel.Namespace)
	spec := paperclipPodSpec(p.Image, p.ServiceAccount, p.Claim, "https://"+relayHost)
	// The cluster has no DNS server: the pod finds the relay's Service by
	// name in its /etc/hosts, as a cluster's DNS would answer.
	spec.HostAliases = []corev1.HostAlias{{IP: relaySvc.Spec.ClusterIP, Hostnames: []string{relayHost}}}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: PaperclipDeployment},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: paperclipServerLabels},
			// One server at a time on the home's embedded PostgreSQL.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: paperclipServerLabels}, Spec: spec}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	p.onClose(p.stopServer)
	probe, err := readExample("examples/bare-job.yaml")
	if err != nil {
		return nil, err
	}
	// The probe's warnings (the profile's env the image does not set) are
	// the agents' to show, not the deployment's.
	quiet := rest.CopyConfig(c.Config)
	quiet.WarningHandler = rest.NoWarnings{}
	quietCS, err := kubernetes.NewForConfig(quiet)
	if err != nil {
		return nil, err
	}
	if err := WaitAdmitting(ctx, quietCS, probe.Jobs[0], ns); err != nil {
		return nil, err
	}
	step("clipjob admits agent Jobs in " + ns + ", completing them from the Deployment " + ns + "/" + PaperclipDeployment)
	p.Server = &Paperclip{}
	p.onClose(func(context.Context) {
		if p.stopForward != nil {
			p.stopForward()
		}
	})
	if err := p.Reconnect(ctx); err != nil {
		return nil, err
	}
	step("Paperclip's pod " + p.Pod + " answers at " + p.Server.URL + " (a port-forward to it; its home on the claim " + p.Claim + ")")
	return p, nil
}

// Reconnect waits for the server's ready pod (a new one, after the last
// was replaced) and forwards a new local port to it: Server.URL changes.
// Not safe beside calls through Server.
func (p *PaperclipInCluster) Reconnect(ctx context.Context) (err error) {
	if p.stopForward != nil {
		p.stopForward()
		p.stopForward = nil
	}
	if p.Pod, err = p.waitPod(ctx); err != nil {
		return err
	}
	addr, stop, err := PortForward(ctx, p.c, p.Namespace, p.Pod, 3100)
	if err != nil {
		return err
	}
	p.stopForward = stop
	p.Server.URL = "http://" + addr
	return p.waitHealthy(ctx)
}

func (p *PaperclipInCluster) onClose(f func(context.Context)) { p.undo = append(p.undo, f) }

// Close stops the server (its PostgreSQL with it) and removes what
// DeployPaperclip made, newest first.
func (p *PaperclipInCluster) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for i := len(p.undo) - 1; i >= 0; i-- {
		p.undo[i](ctx)
	}
	p.undo = nil
}

// ServerLogs is the tail of each of the server's pods' logs, for a
// failure message.
func (p *PaperclipInCluster) ServerLogs(ctx context.Context) string {
	pods, err := p.cs.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
	if err != nil {
		return "listing Paperclip's pods: " + err.Error()
	}
	var out string
	for _, pod := range pods.Items {
		out += fmt.Sprintf("Paperclip's pod %s: %s\n", pod.Name, p.podLog(ctx, pod.Name))
	}
	return out
}

func (p *PaperclipInCluster) podLog(ctx context.Context, pod string) string {
	data, err := p.cs.CoreV1().Pods(p.Namespace).GetLogs(pod, &corev1.PodLogOptions{TailLines: ptr.To[int64](60)}).DoRaw(ctx)
	if err != nil {
		return "its log: " + err.Error()
	}
	return "its log:\n" + string(data)
}

// waitPod waits (a first start on a busy machine takes a while) until a
// pod of the Deployment is ready, and names it.
func (p *PaperclipInCluster) waitPod(ctx context.Context) (string, error) {
	var name, last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := p.cs.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
		if err != nil {
			return false, nil
		}
		for _, pod := range pods.Items {
			last = PodSummary(&pod)
			ready := slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			})
			if pod.DeletionTimestamp == nil && ready {
				name = pod.Name
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("no Paperclip pod was ready in %s (last: %s)\n%s", p.Namespace, last, p.ServerLogs(context.Background()))
	}
	return name, nil
}

// waitHealthy waits until the server answers healthy (its first start
// creates its database on the claim).
func (p *PaperclipInCluster) waitHealthy(ctx context.Context) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 6*time.Minute, true, func(ctx context.Context) (bool, error) {
		var health struct{ Status string }
		last = p.Server.Do(ctx, http.MethodGet, "/api/health", nil, &health)
		if last == nil && health.Status != "ok" {
			last = errors.New("status " + health.Status)
		}
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("Paperclip in pod %s/%s never answered healthy (last: %v)\n%s", p.Namespace, p.Pod, last, p.podLog(context.Background(), p.Pod))
	}
	return nil
}

// stopServer scales the server to none and waits until its pods are gone
// (its PostgreSQL stopped), so nothing of it runs on.
func (p *PaperclipInCluster) stopServer(ctx context.Context) {
	deployments := p.cs.AppsV1().Deployments(p.Namespace)
	dep, err := deployments.Get(ctx, PaperclipDeployment, metav1.GetOptions{})
	if err != nil {
		return
	}
	dep.Spec.Replicas = ptr.To[int32](0)
	if _, err := deployments.Update(ctx, dep, metav1.UpdateOptions{}); err != nil {
		return
	}
	_ = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := p.cs.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
		return err == nil && len(pods.Items) == 0, nil
	})
}

// waitPublishedCA waits until the chart's webhook has published the
// release's CA bundle as the ConfigMap clipjob-ca in ns, holding the CA
// Secret's bundle.
func waitPublishedCA(ctx context.Context, cs kubernetes.Interface, ns string, rel charts.Release) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		ca, err := cs.CoreV1().Secrets(rel.Namespace).Get(ctx, rel.Name+"-ca", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "clipjob-ca", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = "the ConfigMap's bundle is not the CA Secret's"
		return len(ca.Data["ca.crt"]) > 0 && cm.Data["ca.crt"] == string(ca.Data["ca.crt"]), nil
	})
	if err != nil {
		return fmt.Errorf("the chart never published clipjob's CA bundle as ConfigMap %s/clipjob-ca: %w (last: %s)", ns, err, last)
	}
	return nil
}

// PaperclipInClusterValues are the chart's values for a release serving
// namespace ns alone, with the Paperclip Deployment there as its source:
// the webhook (one replica) and the relay placed on the real node, the
// adapter types' profiles too, the relay following ns only.
func PaperclipInClusterValues(ns string) map[string]any {
	sel, tol := cluster.RealNodePlacement()
	selector := map[string]any{} // Helm's values are JSON: no typed maps
	for k, v := range sel {
		selector[k] = v
	}
	tolerations := []any{map[string]any{"key": tol[0].Key, "operator": string(tol[0].Operator), "effect": string(tol[0].Effect)}}
	place := func(m map[string]any) map[string]any {
		m["nodeSelector"], m["tolerations"] = selector, tolerations
		return m
	}
	return map[string]any{
		"agentNamespaces": []any{ns},
		"config": map[string]any{
			"source": map[string]any{"namespace": ns, "deployment": PaperclipDeployment, "container": PaperclipDeployment},
			"profiles": map[string]any{
				"claude_local":   place(map[string]any{}),
				"opencode_local": place(map[string]any{}),
			},
			"defaults": RealNodeAgentDefaults(),
		},
		"webhook":       place(map[string]any{"replicas": 1}),
		"relay":         place(map[string]any{"namespaces": []any{ns}}),
		"networkPolicy": map[string]any{"paperclipServer": map[string]any{"namespace": ns}},
	}
}

// InstallRelease installs the chart as release rel with values through
// Helm's SDK, as `helm install` does (its record in a Secret, which
// `clipjob doctor` reads), beside other installs: webhook.namespaces
// narrows its webhooks to namespaces (the chart's select every namespace
// but its own, and two releases would judge each other's agent Jobs), and
// the relay's store is a volume of the real node. It returns once the
// webhook and relay are available and the webhook has its CA, with the
// function that removes it all.
func InstallRelease(ctx context.Context, c *cluster.Cluster, rel charts.Release, values map[string]any, namespaces ...string) (undo func(context.Context), err error) {
	values = maps.Clone(values)
	webhook := map[string]any{}
	if w, ok := values["webhook"].(map[string]any); ok {
		webhook = maps.Clone(w)
	}
	webhook["namespaces"] = toAny(namespaces)
	values["webhook"] = webhook
	relayName := rel.Name + "-relay"
	storeDir := filepath.Join(c.Dir, rel.Name+"-relay-store")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(storeDir, 65532, 65532); err != nil {
		return nil, err
	}
	cs := c.Clientset()
	pv := HostPathVolume(rel.Name+"-relay-store", storeDir, corev1.ReadWriteOnce, rel.Namespace, relayName)
	if pv, err = cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	h, err := NewHelm(c.Kubeconfig, rel, func(string, ...any) {})
	if err != nil {
		return nil, err
	}
	remove := func(ctx context.Context) {
		_ = h.Uninstall()
		_ = cs.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
	}
	defer func() {
		if err != nil { // undo is nil by then: `return nil, err` set it
			remove(context.Background())
		}
	}()
	if _, err := h.Install(values); err != nil {
		return nil, fmt.Errorf("helm install %s: %w", rel.Name, err)
	}
	for _, d := range []string{rel.Name + "-webhook", relayName} {
		if err := WaitDeploymentAvailable(ctx, cs, rel.Namespace, d); err != nil {
			return nil, err
		}
	}
	if err := WaitCABundle(ctx, cs, rel.Name+"-mutating", rel.Name+"-validating"); err != nil {
		return nil, err
	}
	return remove, nil
}

// WaitDeploymentAvailable waits until Deployment namespace/name has all
// its replicas updated and available.
func WaitDeploymentAvailable(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	var d *appsv1.Deployment
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		d, err = cs.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		want := ptr.Deref(d.Spec.Replicas, 1)
		return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want &&
			d.Status.AvailableReplicas == want && d.Status.Replicas == want, nil
	})
	if err != nil {
		pods, _ := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		var states []string
		for _, p := range pods.Items {
			states = append(states, PodSummary(&p))
		}
		var status appsv1.DeploymentStatus
		if d != nil {
			status = d.Status
		}
		return fmt.Errorf("Deployment %s/%s not available: %w; status %+v; pods %v", namespace, name, err, status, states)
	}
	return nil
}

// WaitCABundle waits until the webhook has injected its CA into both
// configurations, mutating and validating.
func WaitCABundle(ctx context.Context, cs kubernetes.Interface, mutating, validating string) error {
	a := cs.AdmissionregistrationV1()
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := a.MutatingWebhookConfigurations().Get(ctx, mutating, metav1.GetOptions{})
		if err != nil || len(m.Webhooks) == 0 || len(m.Webhooks[0].ClientConfig.CABundle) == 0 {
			return false, nil
		}
		v, err := a.ValidatingWebhookConfigurations().Get(ctx, validating, metav1.GetOptions{})
		return err == nil && len(v.Webhooks) > 0 && len(v.Webhooks[0].ClientConfig.CABundle) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("the webhook never injected its CA bundle into %s and %s: %w", mutating, validating, err)
	}
	return nil
}

// WaitAdmitting waits until an agent Job like job, in ns, is admitted
// mutated (a dry run): its source Deployment exists, and the API server
// reaches the webhook through its Service (a Deployment is available
// before kube-proxy has the Service's rules, and until then the API
// server's calls are refused).
func WaitAdmitting(ctx context.Context, cs kubernetes.Interface, job *batchv1.Job, ns string) error {
	job = job.DeepCopy()
	job.Namespace = ns
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		stored, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = err
		if apierrors.IsAlreadyExists(err) {
			return false, err
		}
		return err == nil && stored.Annotations[contract.AnnotationProfile] != "", nil
	})
	if err != nil {
		return fmt.Errorf("clipjob's webhook never admitted a Job in %s: %w (last: %v)", ns, err, last)
	}
	return nil
}

// PaperclipPodSpec is paperclipPodSpec, for the test that holds
// examples/paperclip-in-cluster.yaml to it.
func PaperclipPodSpec(image, serviceAccount, claim, relayURL string) corev1.PodSpec {
	return paperclipPodSpec(image, serviceAccount, claim, relayURL)
}

// paperclipPodSpec is the Paperclip server's pod: the image's own
// entrypoint and command, uid 1000 under the restricted Pod Security
// level, its home on claim at /paperclip, the relay's token projected and
// clipjob's CA mounted as the adapter's README asks. Paperclip runs in
// local_trusted mode, bound to the pod's loopback, reached by
// port-forward: the image's authenticated mode would need a board login
// made first.
func paperclipPodSpec(image, serviceAccount, claim, relayURL string) corev1.PodSpec {
	sel, tol := cluster.RealNodePlacement()
	return corev1.PodSpec{
		ServiceAccountName: serviceAccount,
		NodeSelector:       sel,
		Tolerations:        tol,
		SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000),
			FSGroup: ptr.To[int64](1000), RunAsNonRoot: ptr.To(true),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{
			Name:  PaperclipDeployment,
			Image: image,
			Env: []corev1.EnvVar{
				{Name: "PAPERCLIP_DEPLOYMENT_MODE", Value: "local_trusted"},
				{Name: "HOST", Value: "127.0.0.1"},
				{Name: "SERVE_UI", Value: "false"},
				{Name: "PAPERCLIP_TELEMETRY_DISABLED", Value: "1"},
				{Name: "DO_NOT_TRACK", Value: "1"},
				{Name: "PAPERCLIP_UPDATE_CHECK", Value: "0"},
				{Name: "PAPERCLIP_DB_BACKUP_ENABLED", Value: "false"},
				{Name: "CLIPJOB_RELAY_URL", Value: relayURL},
				{Name: "CLIPJOB_RELAY_CA_FILE", Value: "/var/run/clipjob-ca/ca.crt"},
				{Name: "PAPERCLIP_AGENT_JWT_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "paperclip"}, Key: "agent-jwt-secret"}}},
			},
			SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			// Ready once it answers healthy on its loopback (the first
			// start creates its database on the claim and applies every
			// migration: a minute or more).
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 2, TimeoutSeconds: 5, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
				Command: []string{"/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:3100/api/health"}}}},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "home", MountPath: ociimage.PaperclipHome},
				{Name: "clipjob-relay-token", MountPath: "/var/run/secrets/clipjob-relay", ReadOnly: true},
				{Name: "clipjob-ca", MountPath: "/var/run/clipjob-ca", ReadOnly: true},
			},
		}},
		Volumes: []corev1.Volume{
			{Name: "home", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}},
			{Name: "clipjob-relay-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "clipjob-relay", ExpirationSeconds: ptr.To[int64](3600), Path: "token"}}}}}},
			// Optional, as examples/paperclip-in-cluster.yaml has it: there
			// the server may start before the chart publishes the bundle.
			{Name: "clipjob-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "clipjob-ca"}, Optional: ptr.To(true)}}},
		},
	}
}
