package realnode

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/ociimage"
)

// TestPaperclipInTheCluster: Paperclip as operators deploy it. The image
// `make paperclip-image` builds runs as the Paperclip Deployment, with its
// home on a ReadWriteMany claim at /paperclip and its own ServiceAccount
// bound to the Role of the adapter's README; the image's entrypoint
// registers clipjob's adapter. clipjob is installed from its chart (a
// release of its own, for this namespace), with that Deployment as the
// source it completes agent Jobs from; the adapter reaches the API server
// with the pod's ServiceAccount and the chart's relay through its Service
// with a projected token, trusting clipjob's CA copied beside the server
// as the README says. Agents of both types run through the server's API,
// and what Paperclip records is the agents': status, lines in order,
// cost, session, the second run resuming the first's session from the
// agent's home on the claim, and an OpenCode agent's comment on the issue
// it was assigned.
func TestPaperclipInTheCluster(t *testing.T) {
	t.Parallel() // namespaces, a release and a server of its own
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, cs := suite.cluster, suite.cs
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }

	// The two images, side by side: the Paperclip image (cached by its
	// inputs) and clipjob's.
	paperclipImage := make(chan error, 1)
	var image string
	go func() {
		var err error
		image, err = harness.LoadPaperclipImage(ctx, c)
		paperclipImage <- err
	}()
	if _, err := harness.LoadClipjobImage(ctx, c); err != nil {
		t.Fatal(err)
	}
	step("clipjob's image loaded")

	// The namespace Paperclip and its agents run in: the suite's install,
	// registered for every namespace, leaves it, as the chart's
	// webhook.excludeNamespaces does.
	const ns = "paperclip-in-cluster"
	rel := charts.Release{Name: "clipjob-pc", Namespace: "clipjob-pc-system"}
	for _, name := range []string{ns, rel.Namespace} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		for _, name := range []string{ns, rel.Namespace} {
			_ = cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		}
	})
	if err := suite.in.ExcludeNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}

	// clipjob from its chart, for that namespace, its source the
	// Paperclip Deployment there.
	installRelease(ctx, t, rel, paperclipInClusterValues(ns), ns)
	step("clipjob's chart installed")
	relayName := rel.Name + "-relay"
	relaySvc, err := cs.CoreV1().Services(rel.Namespace).Get(ctx, relayName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// What the adapter's README has an operator do on Paperclip's side:
	// the Role bound to the server's ServiceAccount, and clipjob's CA
	// copied into a ConfigMap beside the server.
	serviceAccount, err := harness.ApplyPaperclipServerRBAC(ctx, cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cs.CoreV1().Secrets(rel.Namespace).Get(ctx, rel.Name+"-ca", metav1.GetOptions{})
	if err != nil || len(ca.Data["ca.crt"]) == 0 {
		t.Fatalf("clipjob's CA Secret %s/%s-ca: %v", rel.Namespace, rel.Name, err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "clipjob-ca"},
		Data: map[string]string{"ca.crt": string(ca.Data["ca.crt"])}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The server's secret its agents' callback tokens are signed with, as
	// an operator keeps it: in a Secret, handed to the server's env.
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "paperclip"},
		StringData: map[string]string{"agent-jwt-secret": "e2e-in-cluster-agent-jwt-secret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Paperclip's home: a ReadWriteMany claim, here a directory of the
	// real node prepared as an NFS export for uid 1000.
	home := filepath.Join(c.Dir, ns+"-home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, harness.SharedUID, harness.SharedGID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(home, 0o775|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	const claim = "paperclip-home"
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, harness.HostPathVolume(ns+"-home", home, corev1.ReadWriteMany, ns, claim), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().PersistentVolumes().Delete(context.Background(), ns+"-home", metav1.DeleteOptions{})
	})
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr.To(""), VolumeName: ns + "-home",
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := <-paperclipImage; err != nil {
		t.Fatal(err)
	}
	step("the Paperclip image loaded")
	// The Paperclip Deployment, the source the release's config names.
	relayHost := fmt.Sprintf("%s.%s.svc", relayName, rel.Namespace)
	spec := paperclipPodSpec(image, serviceAccount, claim, "https://"+relayHost)
	// The cluster has no DNS server: the pod finds the relay's Service
	// by name in its /etc/hosts, as a cluster's DNS would answer.
	spec.HostAliases = []corev1.HostAlias{{IP: relaySvc.Spec.ClusterIP, Hostnames: []string{relayHost}}}
	labels := map[string]string{"app": "paperclip-server"}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "paperclip"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			// One server at a time on the home's embedded PostgreSQL.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPaperclipDeployment(t, ns) })
	waitAdmittingIn(ctx, t, ns)
	step("the release admits agent Jobs completed from the Deployment")
	pod := waitPaperclipPod(ctx, t, ns)
	step("the Paperclip pod is ready")
	addr, stop, err := harness.PortForward(ctx, c, ns, pod, 3100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	pc := &harness.Paperclip{URL: "http://" + addr}
	waitPaperclipHealthy(ctx, t, pc, ns, pod)
	step("Paperclip answers healthy")

	// Loaded at start, registered by the image's entrypoint.
	checkAdaptersLoaded(ctx, t, pc, "the image's start")
	// Its home is the claim: the embedded PostgreSQL and the adapters'
	// records are on the volume.
	for _, f := range []string{"instances/default/db/PG_VERSION", "adapter-plugins.json"} {
		if _, err := os.Stat(filepath.Join(home, f)); err != nil {
			t.Errorf("Paperclip's home on the claim lacks %s: %v", f, err)
		}
	}

	run, first := runFirstAgent(ctx, t, pc, "Acme in the cluster", "lines=6 rate=20 probe=1 (agent {{agent.name}})")
	step("the first run succeeded")
	// In the agent's pod: Paperclip's callback token for the run, signed
	// with the server's secret, and not the secret itself (the server's
	// env, which clipjob inherits from, has it); the run's own
	// directories of the home, not the home.
	mounts, probe := runMounts(ctx, t, pc, run.ID)
	if !slices.Contains(probe.Env, "PAPERCLIP_API_KEY") || slices.Contains(probe.Env, "PAPERCLIP_AGENT_JWT_SECRET") {
		t.Errorf("the agent's env names %v: want PAPERCLIP_API_KEY (the run's token), not PAPERCLIP_AGENT_JWT_SECRET (the server's)", probe.Env)
	}
	for m := range mounts {
		if m == ociimage.PaperclipHome || strings.HasPrefix(m, instanceRoot+"db") {
			t.Errorf("the agent's pod mounts %s of Paperclip's home (mounts %v)", m, mounts)
		}
	}
	// The run's Job, completed from the running Deployment: its image, its
	// claim, Paperclip's workspace for the agent on it as the working
	// directory, created by the server's ServiceAccount.
	jobs, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: contract.LabelRunID + "=" + run.ID})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("the run's Jobs: %d, %v; want one", len(jobs.Items), err)
	}
	job := jobs.Items[0]
	if got := job.Spec.Template.Spec.Containers[0].Image; got != image {
		t.Errorf("the run's Job runs %s; want the Paperclip Deployment's image %s", got, image)
	}
	if got := job.Annotations[contract.AnnotationSource]; !strings.HasPrefix(got, ns+"/paperclip ") {
		t.Errorf("the run's Job was completed from %q; want the Deployment %s/paperclip", got, ns)
	}
	if got, want := job.Annotations[contract.AnnotationCreatedBy], "system:serviceaccount:"+ns+":"+serviceAccount; got != want {
		t.Errorf("the run's Job was created by %q; want the server's ServiceAccount %s", got, want)
	}
	if got, want := job.Annotations[contract.AnnotationWorkingDir], instanceRoot+"workspaces/"+first.AgentID; got != want {
		t.Errorf("the run's working directory: %q; want Paperclip's workspace of the agent on the claim, %s", got, want)
	}
	claims := 0
	for _, v := range job.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			if v.PersistentVolumeClaim.ClaimName != claim {
				t.Errorf("the run's pod mounts claim %s; want only Paperclip's home, %s", v.PersistentVolumeClaim.ClaimName, claim)
			}
			claims++
		}
	}
	if claims == 0 {
		t.Errorf("the run's pod mounts no part of Paperclip's home (volumes %v)", job.Spec.Template.Spec.Volumes)
	}

	// The agent's second run resumes the session the first left in the
	// agent's home on the claim.
	agentHome := filepath.Join(home, "instances", "default", "companies", job.Labels[contract.LabelCompanyID], "agents", first.AgentID, "home")
	if _, err := os.Stat(filepath.Join(agentHome, ".fakeagent", "sessions", first.SessionAfter)); err != nil {
		t.Errorf("the first run's session is not in the agent's home on the claim: %v", err)
	}
	resumeSecondRun(ctx, t, pc, first)
	step("the second run resumed the first's session")

	// An OpenCode agent, woken by the issue it is assigned, comments its
	// final message on it.
	workAnIssue(ctx, t, pc, job.Labels[contract.LabelCompanyID])
	step("the OpenCode agent commented on its issue")
}

// paperclipInClusterValues are the chart's values for a release serving
// namespace ns alone, with the Paperclip Deployment there as its source:
// the webhook (one replica) and the relay placed on the real node, the
// adapter types' profiles too, the relay following ns only.
func paperclipInClusterValues(ns string) map[string]any {
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
			"source": map[string]any{"namespace": ns, "deployment": "paperclip", "container": "paperclip"},
			"profiles": map[string]any{
				"claude_local":   place(map[string]any{}),
				"opencode_local": place(map[string]any{}),
			},
		},
		"webhook":       place(map[string]any{"replicas": 1}),
		"relay":         place(map[string]any{"namespaces": []any{ns}}),
		"networkPolicy": map[string]any{"paperclipServer": map[string]any{"namespace": ns}},
	}
}

// installRelease installs the chart as release rel with values, as `helm
// install` would, beside the suite's own install: its webhook
// configurations narrowed to namespaces (the one change, as for the
// suite's installs: the chart's select every namespace but its own, and
// two releases would judge each other's agent Jobs), the relay's store on
// a volume of the real node. Everything goes when the test ends.
func installRelease(ctx context.Context, t *testing.T, rel charts.Release, values map[string]any, namespaces ...string) {
	t.Helper()
	r, err := charts.Render(rel, values)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(suite.cluster.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	relayName := rel.Name + "-relay"
	storeDir := filepath.Join(suite.cluster.Dir, rel.Name+"-relay-store")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(storeDir, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	pv := harness.HostPathVolume(rel.Name+"-relay-store", storeDir, corev1.ReadWriteOnce, rel.Namespace, relayName)
	if err := cl.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	created := []client.Object{pv}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for i := len(created) - 1; i >= 0; i-- {
			_ = cl.Delete(ctx, created[i], client.PropagationPolicy(metav1.DeletePropagationBackground))
		}
	})
	narrow := func(sel **metav1.LabelSelector) {
		if *sel == nil {
			*sel = &metav1.LabelSelector{}
		}
		(*sel).MatchExpressions = append((*sel).MatchExpressions, metav1.LabelSelectorRequirement{
			Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: namespaces})
	}
	for _, u := range r.Objects {
		var o client.Object = u
		switch u.GetKind() {
		case "MutatingWebhookConfiguration":
			m := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := charts.Decode(u, m); err != nil {
				t.Fatal(err)
			}
			for i := range m.Webhooks {
				narrow(&m.Webhooks[i].NamespaceSelector)
			}
			o = m
		case "ValidatingWebhookConfiguration":
			v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := charts.Decode(u, v); err != nil {
				t.Fatal(err)
			}
			for i := range v.Webhooks {
				narrow(&v.Webhooks[i].NamespaceSelector)
			}
			o = v
		}
		if err := cl.Create(ctx, o); err != nil {
			t.Fatalf("creating the chart's %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		created = append(created, o)
	}
	for _, d := range []string{rel.Name + "-webhook", relayName} {
		waitAvailable(ctx, t, rel.Namespace, d)
	}
	waitCABundle(ctx, t, rel.Name+"-mutating", rel.Name+"-validating")
}

// paperclipPodSpec is the Paperclip server's pod: the image's own
// entrypoint and command, uid 1000 under the restricted Pod Security
// level, its home on claim at /paperclip, the relay's token projected and
// clipjob's CA mounted as the adapter's README asks. Paperclip runs in
// local_trusted mode, bound to the pod's loopback, where the test reaches
// it by port-forward: the image's authenticated mode would need a board
// login the test would first have to make.
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
			Name:  "paperclip",
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
			{Name: "clipjob-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "clipjob-ca"}}}},
		},
	}
}

// waitPaperclipPod waits (a first start on a busy machine takes a while)
// until a pod of the Deployment is ready, and names it.
func waitPaperclipPod(ctx context.Context, t *testing.T, ns string) string {
	t.Helper()
	var name, last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := suite.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			last = harness.PodSummary(&p)
			ready := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			})
			if p.DeletionTimestamp == nil && ready {
				name = p.Name
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no Paperclip pod was ready in %s (last: %s)", ns, last)
	}
	return name
}

// waitPaperclipHealthy waits until the server answers healthy (its first
// start creates its database on the claim).
func waitPaperclipHealthy(ctx context.Context, t *testing.T, pc *harness.Paperclip, ns, pod string) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 6*time.Minute, true, func(ctx context.Context) (bool, error) {
		var health struct{ Status string }
		last = pc.Do(ctx, http.MethodGet, "/api/health", nil, &health)
		if last == nil && health.Status != "ok" {
			last = errors.New("status " + health.Status)
		}
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("Paperclip in pod %s/%s never answered healthy (last: %v)\n%s", ns, pod, last, podLog(ns, pod))
	}
}

// podLog is the tail of a pod's log, for a failure message.
func podLog(ns, pod string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data, err := suite.cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{TailLines: ptr.To[int64](60)}).DoRaw(ctx)
	if err != nil {
		return "its log: " + err.Error()
	}
	return "its log:\n" + string(data)
}

// stopPaperclipDeployment scales the server to none and waits until its
// pod is gone (its PostgreSQL stopped), so nothing of it runs on after
// the test.
func stopPaperclipDeployment(t *testing.T, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dep, err := suite.cs.AppsV1().Deployments(ns).Get(ctx, "paperclip", metav1.GetOptions{})
	if err != nil {
		return
	}
	if t.Failed() {
		pods, _ := suite.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
		for _, p := range pods.Items {
			t.Logf("Paperclip's pod %s: %s", p.Name, podLog(ns, p.Name))
		}
	}
	dep.Spec.Replicas = ptr.To[int32](0)
	if _, err := suite.cs.AppsV1().Deployments(ns).Update(ctx, dep, metav1.UpdateOptions{}); err != nil {
		t.Logf("stopping the Paperclip Deployment: %v", err)
		return
	}
	_ = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := suite.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
		return err == nil && len(pods.Items) == 0, nil
	})
}
