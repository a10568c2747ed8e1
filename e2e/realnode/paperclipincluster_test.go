package realnode

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/ociimage"
)

// TestPaperclipInTheCluster: Paperclip as operators deploy it. The image
// `make paperclip-image` builds runs as the Paperclip Deployment, with its
// home on a ReadWriteMany claim at /paperclip and its own ServiceAccount
// bound to the Role of the adapter's README; the image's entrypoint
// registers clipjob's adapter, which reaches the API server with the
// pod's ServiceAccount and the relay with a projected token. That
// Deployment is the source clipjob completes the agents' Jobs from. One
// agent runs through the server's API, and what Paperclip records is the
// agent's.
func TestPaperclipInTheCluster(t *testing.T) {
	t.Parallel() // a namespace, an install and a server of its own
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, cs := suite.cluster, suite.cs
	image, err := harness.LoadPaperclipImage(ctx, c)
	if err != nil {
		t.Fatal(err)
	}

	// clipjob for this namespace alone: the suite's install, registered
	// for every namespace, leaves it, as webhook.excludeNamespaces does.
	const ns = "paperclip-in-cluster"
	if err := suite.in.ExcludeNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	bin, err := harness.BuildOnce(c.Dir, "clipjob-webhook")
	if err != nil {
		t.Fatal(err)
	}
	in, err := harness.NewInstall(ctx, c, bin, harness.InstallOptions{Namespace: ns, Config: realNodeProfiles()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Stop(context.Background()) })
	relay, err := in.PodRelay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relay.Stop)
	serviceAccount, err := harness.ApplyPaperclipServerRBAC(ctx, cs, ns)
	if err != nil {
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
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr.To(""), VolumeName: ns + "-home",
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// clipjob's CA, copied beside the server as the README says.
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "clipjob-ca", Namespace: ns},
		Data: map[string]string{"ca.crt": string(c.CA.CertPEM)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The Paperclip Deployment the install's config names as its source.
	dep, err := cs.AppsV1().Deployments(ns).Get(ctx, "paperclip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep.Spec.Replicas = ptr.To[int32](1)
	dep.Spec.Template.Spec = paperclipPodSpec(image, serviceAccount, claim, "https://"+relay.APIAddr)
	if _, err := cs.AppsV1().Deployments(ns).Update(ctx, dep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPaperclipDeployment(t, ns) })
	pod := waitPaperclipPod(ctx, t, ns)
	addr, stop, err := harness.PortForward(ctx, c, ns, pod, 3100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	pc := &harness.Paperclip{URL: "http://" + addr}
	waitPaperclipHealthy(ctx, t, pc, ns, pod)

	// Loaded at start, registered by the image's entrypoint.
	checkAdaptersLoaded(ctx, t, pc, "the image's start")
	// Its home is the claim: the embedded PostgreSQL and the adapters'
	// records are on the volume.
	for _, f := range []string{"instances/default/db/PG_VERSION", "adapter-plugins.json"} {
		if _, err := os.Stat(filepath.Join(home, f)); err != nil {
			t.Errorf("Paperclip's home on the claim lacks %s: %v", f, err)
		}
	}

	run, _ := runFirstAgent(ctx, t, pc, "Acme in the cluster", "lines=6 rate=20 (agent {{agent.name}})")
	// The run's Job was completed from the running Deployment: its image.
	jobs, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "paperclip.io/run-id=" + run.ID})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("the run's Jobs: %d, %v; want one", len(jobs.Items), err)
	}
	if got := jobs.Items[0].Spec.Template.Spec.Containers[0].Image; got != image {
		t.Errorf("the run's Job runs %s; want the Paperclip Deployment's image %s", got, image)
	}
}

// paperclipPodSpec is the Paperclip server's pod: the image's own
// entrypoint and command, uid 1000, its home on claim at /paperclip, the
// relay's token projected and clipjob's CA mounted as the adapter's README
// asks. Paperclip runs in local_trusted mode, bound to the pod's loopback,
// where the test reaches it by port-forward: the image's authenticated
// mode would need a board login the test would first have to make.
func paperclipPodSpec(image, serviceAccount, claim, relayURL string) corev1.PodSpec {
	sel, tol := cluster.RealNodePlacement()
	return corev1.PodSpec{
		ServiceAccountName: serviceAccount,
		NodeSelector:       sel,
		Tolerations:        tol,
		SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000),
			FSGroup: ptr.To[int64](1000), RunAsNonRoot: ptr.To(true)},
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
			},
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

// waitPaperclipPod waits (loading a large image and a first start take a
// while on a busy machine) until a pod of the Deployment runs, and names it.
func waitPaperclipPod(ctx context.Context, t *testing.T, ns string) string {
	t.Helper()
	var name, last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := suite.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=paperclip-server"})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			last = p.Name + " " + string(p.Status.Phase)
			for _, s := range p.Status.ContainerStatuses {
				if s.State.Waiting != nil {
					last += " " + s.State.Waiting.Reason + ": " + s.State.Waiting.Message
				}
				if s.State.Terminated != nil {
					last += " terminated " + s.State.Terminated.Reason
				}
			}
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				name = p.Name
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no Paperclip pod ran in %s (last: %s)", ns, last)
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
