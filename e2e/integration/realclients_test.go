package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/internal/testing/golden"
)

// TestRealClientsJobsOnTheCluster: the Jobs the real Paperclip clients
// build with their own code (decide/testdata/real-clients), created on the
// API server through clipjob's webhooks as the webhook's ServiceAccount
// with exactly the chart's RBAC: each is admitted as it is under its
// documented config, and refused under one that allows only their busybox
// init, naming the setting. The plugin's Job is then created for real in
// its tenant namespace, where only the config's tenantNamespaces gave the
// webhook its Role, and its env Secret after it, as the plugin does.
func TestRealClientsJobsOnTheCluster(t *testing.T) {
	// The clients' namespaces, moved to the install's: paperclip (the
	// server's) is its own, paperclip-co-1 (the plugin's company) its
	// neighbour, and the config's company glob follows.
	in := newInstall(t, harness.InstallOptions{Also: []string{"co-1"}})
	company := in.Namespaces[1]
	ctx := ctxT(t)
	dir := filepath.Join(harness.Root(), "decide", "testdata", "real-clients")
	read := func(name string) *manifest.Set { return golden.ReadManifests(t, filepath.Join(dir, name)) }
	// The cluster the clients read: their Secrets and, under a name of its
	// own, their Paperclip Deployment (the suite's source stays as it is).
	src := read("source.yaml")
	for _, o := range append(src.Others, read("objects.yaml").Others...) {
		var err error
		switch o := o.(type) {
		case *corev1.Secret:
			o.Namespace = in.Namespace
			_, err = suite.cs.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.PersistentVolumeClaim:
			o.Namespace = in.Namespace // the install has the shared claim already
			_, err = suite.cs.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	dep := src.Deployments[0].DeepCopy()
	dep.Name, dep.Namespace = "paperclip-real-clients", in.Namespace
	if _, err := suite.cs.AppsV1().Deployments(in.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Each config as documented, its source pointed at that Deployment.
	useConfig := func(file string) {
		var cfg map[string]any
		if err := yaml.Unmarshal(read(file).Raw[0], &cfg); err != nil {
			t.Fatal(err)
		}
		source, _ := cfg["source"].(map[string]any)
		if source == nil {
			source = map[string]any{}
		}
		source["deployment"], source["namespace"] = dep.Name, in.Namespace
		cfg["source"] = source
		if globs, ok := cfg["tenantNamespaces"].([]any); ok {
			for i, g := range globs {
				globs[i] = strings.Replace(g.(string), "paperclip-co-", in.Namespace+"-co-", 1)
			}
		}
		data, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		in.WriteConfig(ctx, t, string(data), true)
	}
	dryRun := func(job *batchv1.Job) (*batchv1.Job, error) {
		return suite.cs.BatchV1().Jobs(job.Namespace).Create(ctx, job.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	}
	jobOf := func(file string) *batchv1.Job {
		j := read(file).Jobs[0]
		if j.Namespace == "paperclip" {
			j.Namespace = in.Namespace
		} else {
			j.Namespace = company
		}
		return j
	}

	useConfig("config-adapters.yaml")
	for _, file := range []string{"claude-job.json", "claude-job-large.json", "opencode-job.json"} {
		stored, err := dryRun(jobOf(file))
		if err != nil {
			t.Errorf("%s under its documented config: %v", file, err)
			continue
		}
		if stored.Spec.Template.Spec.Containers[0].Image != jobOf(file).Spec.Template.Spec.Containers[0].Image {
			t.Errorf("%s: its image was replaced", file)
		}
	}
	useConfig("config-busybox.yaml")
	for _, file := range []string{"claude-job.json", "opencode-job.json"} {
		if _, err := dryRun(jobOf(file)); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "list it in policy.secrets.shared") {
			t.Errorf("%s without the shared key: want 403 naming policy.secrets.shared, got %v", file, err)
		}
	}
	plugin := jobOf("plugin-job.json")
	if _, err := dryRun(plugin); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "profiles.claude_local.automountServiceAccountToken: true") {
		t.Errorf("the plugin's Job under config-busybox: want 422 naming the token setting, got %v", err)
	}

	useConfig("config-plugin.yaml")
	stored, err := suite.cs.BatchV1().Jobs(plugin.Namespace).Create(ctx, plugin.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the plugin's Job in its tenant namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = suite.cs.BatchV1().Jobs(plugin.Namespace).Delete(ctx, plugin.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
	spec := stored.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken || spec.ServiceAccountName != "paperclip-tenant-sa" {
		t.Errorf("the plugin's token or ServiceAccount changed: %v %s", spec.AutomountServiceAccountToken, spec.ServiceAccountName)
	}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("the server's claim %s reached the tenant namespace", v.PersistentVolumeClaim.ClaimName)
		}
		if v.Name == "workspace" && (v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil) {
			t.Errorf("the plugin's own workspace volume was changed: %+v", v)
		}
	}
	// The plugin's env Secret comes after its Job, owned by it.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: plugin.Name + "-env", Namespace: plugin.Namespace,
		Labels: map[string]string{"paperclip.io/run-id": plugin.Labels["paperclip.io/run-id"], "paperclip.io/managed-by": "paperclip-k8s-plugin"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: stored.Name, UID: stored.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		StringData: map[string]string{"BOOTSTRAP_TOKEN": "x"}}
	if _, err := suite.cs.CoreV1().Secrets(plugin.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The claim was written in the tenant namespace, by the chart's RBAC.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		leases, err := suite.cs.CoordinationV1().Leases(plugin.Namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(leases.Items) > 0, nil
	}); err != nil {
		t.Errorf("no claim Lease in %s: %v", plugin.Namespace, err)
	}
}
