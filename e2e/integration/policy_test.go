package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/cmd/clipjob/app"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
	"github.com/paperclipai/clipjob/internal/testing/golden"
)

// TestDisallowedImageDenied: a disallowed image is denied with the message a
// user needs.
func TestDisallowedImageDenied(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.BareJob(t, "e2e-evil-image")
	job.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "evil.example.com/miner:1", Command: []string{"mine"}}}
	_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("want 403 Forbidden, got %v", err)
	}
	for _, want := range []string{`denied the request`, `spec.template.spec.containers[0].image`,
		`container "agent": image "evil.example.com/miner:1"`, `is not allowed; allowed: `} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	in.AssertNoJob(ctx, t, job.Name)
}

// TestPrivilegedContainerDenied: a privileged container is denied. The
// mutating webhook would restore the floor, so this runs the case it exists
// for: mutation failing open (endpoint gone, failurePolicy Ignore) and the
// validating webhook holding the line on the final object. A hostPath
// volume, which the mutator does not touch, is denied with both webhooks in
// place.
func TestPrivilegedContainerDenied(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	dead, _ := cluster.FreePorts(1)
	if err := in.Register(ctx, harness.RegisterOptions{MutatingAddr: fmt.Sprintf("127.0.0.1:%d", dead[0]), MutatingFailure: admissionregistrationv1.Ignore}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Register(context.Background(), harness.RegisterOptions{}); err != nil {
			t.Error(err)
		}
	})
	job := in.BareJob(t, "e2e-privileged")
	job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	job.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "ghcr.io/paperclipai/paperclip:v2026.11.3",
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
	// The API server sees the re-pointed configuration through a watch:
	// wait (with dry runs, which store nothing) until mutation is bypassed.
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		dry, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil || dry.Annotations[contract.AnnotationProfile] == "", nil
	})
	_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest": privileged (container "agent" must not set securityContext.privileged=true)`) {
		t.Fatalf("want a PodSecurity denial naming the privileged container, got %v", err)
	}
	in.AssertNoJob(ctx, t, job.Name)

	if err := in.Register(ctx, harness.RegisterOptions{Addr: in.Webhook.Addr}); err != nil {
		t.Fatal(err)
	}
	hp := in.BareJob(t, "e2e-hostpath")
	hp.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, hp, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `restricted volume types (volume "host" uses restricted volume type "hostPath")`) {
		t.Fatalf("want a hostPath denial, got %v", err)
	}
}

// TestOneActiveRunPerAgent: concurrent creates for one agent, spread over
// three webhook replicas, admit exactly one; once that run ends, or its Job
// is deleted, the agent is free again at once.
func TestOneActiveRunPerAgent(t *testing.T) {
	in := newInstall(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const agent = "agent-race"
	agentJob := func(name string) *batchv1.Job {
		job := in.BareJob(t, name)
		job.Labels[contract.LabelAgentID] = agent
		return job
	}
	var winner string
	ok := t.Run("100 concurrent creates over three replicas admit one", func(t *testing.T) {
		replicas := in.StartReplicas(ctx, t, 3, nil)
		before := validateCounts(t, in)
		admitted, conflicts, other := createConcurrently(ctx, t, in, 100, "e2e-race", agentJob)
		if len(admitted) != 1 || conflicts != 99 || len(other) > 0 {
			t.Fatalf("100 concurrent creates: admitted %v, %d conflicts, other errors %v", admitted, conflicts, other)
		}
		after := validateCounts(t, in)
		for i := range replicas {
			if after[i] <= before[i] {
				t.Errorf("replica %d handled no validation (%v -> %v): the load did not spread", i, before, after)
			}
		}
		winner = admitted[0]
		t.Logf("admitted %s; %d refused with 409; validations per replica %v", winner, conflicts, diff(before, after))
	})
	if !ok {
		return
	}
	next, third := agentJob("e2e-race-next"), agentJob("e2e-race-third")
	ok = t.Run("a finished run frees the agent", func(t *testing.T) {
		// kwok ends the pod; the next run is admitted with no cleanup step.
		in.FinishRun(ctx, t, winner, "0")
		if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, next, metav1.CreateOptions{}); err != nil {
			t.Fatalf("run after completion refused: %v", err)
		}
		if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, third, metav1.CreateOptions{}); !apierrors.IsConflict(err) {
			t.Fatalf("a second active run was admitted: %v", err)
		}
	})
	if !ok {
		return
	}
	t.Run("a deleted run frees the agent", func(t *testing.T) {
		// A claim on a Job that is not there holds for the grace window
		// for unseen Jobs, an hour here: the agent is free within the
		// wait below only because the claim controller saw the deletion.
		original := in.Config(t)
		in.WriteConfig(ctx, t, string(original)+"policy:\n  concurrency:\n    pendingGraceSeconds: 3600\n", true)
		if err := suite.cs.BatchV1().Jobs(in.Namespace).Delete(ctx, next.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, third, metav1.CreateOptions{})
			if apierrors.IsConflict(err) {
				return false, nil
			}
			return true, err
		})
		if err != nil {
			t.Fatalf("agent still busy two minutes after its Job was deleted: %v", err)
		}
		t.Logf("agent freed %s after deletion", time.Since(deleted).Round(10*time.Millisecond))
	})
}

// createConcurrently creates n Jobs made by job at once, named prefix-NNN,
// from a client whose own rate limit does not serialize them, and sorts
// the answers.
func createConcurrently(ctx context.Context, t *testing.T, in *harness.Install, n int, prefix string, job func(name string) *batchv1.Job) (admitted []string, conflicts int, other []error) {
	t.Helper()
	cfg := *suite.cluster.Config
	cfg.QPS, cfg.Burst = 1000, 1000
	fast := kubernetes.NewForConfigOrDie(&cfg)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		j := job(fmt.Sprintf("%s-%03d", prefix, i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := fast.BatchV1().Jobs(in.Namespace).Create(ctx, j, metav1.CreateOptions{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted = append(admitted, j.Name)
			case apierrors.IsConflict(err) && strings.Contains(err.Error(), "already has an active run: Job "+in.Namespace+"/"+prefix+"-"):
				conflicts++
			default:
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	return admitted, conflicts, other
}

// TestDryRunWritesNoClaim: a dry-run create checks but writes no claim.
func TestDryRunWritesNoClaim(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.BareJob(t, "e2e-dry-claim")
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	key := claim.KeyFor(job, in.LoadConfig(t).Policy.Concurrency)
	if _, err := suite.cs.CoordinationV1().Leases(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("dry run wrote claim %s: %v", key.Name, err)
	}
	// A real create does write it, and a dry run of a second run is refused.
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := suite.cs.CoordinationV1().Leases(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("real create wrote no claim: %v", err)
	}
	second := in.BareJob(t, "e2e-dry-claim-2")
	second.Labels[contract.LabelAgentID] = job.Labels[contract.LabelAgentID]
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, second, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsConflict(err) {
		t.Errorf("dry run of a second run: want 409, got %v", err)
	}
}

// TestAgentLabelImmutable: changing paperclip.io/agent-id on UPDATE is
// denied.
func TestAgentLabelImmutable(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-relabel"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"labels":{"paperclip.io/agent-id":"agent-someone-else"}}}`)
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `metadata.labels[paperclip.io/agent-id]: Invalid value: "agent-someone-else": is immutable (was "agent-e2e-relabel")`) {
		t.Fatalf("want the agent-id change denied, got %v", err)
	}
	ok := []byte(`{"metadata":{"labels":{"team":"platform"}}}`)
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, job.Name, types.MergePatchType, ok, metav1.PatchOptions{}); err != nil {
		t.Errorf("an unrelated label change was refused: %v", err)
	}
}

// TestJobRecordsItsCreator: a Job names the user who created it, which is
// how the Paperclip adapter tells its own runs from a Job that copied their
// labels. A client cannot name another creator, and nobody (cluster-admin
// included) can rewrite or remove it later.
func TestJobRecordsItsCreator(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	const server = "system:serviceaccount:paperclip:paperclip"
	maker := in.ClientAs(ctx, t, "e2e-job-maker", "create", "get", "patch")
	forged := in.BareJob(t, "e2e-forged-creator")
	forged.Annotations = map[string]string{contract.AnnotationCreatedBy: server}
	job, err := maker.BatchV1().Jobs(in.Namespace).Create(ctx, forged, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := job.Annotations[contract.AnnotationCreatedBy], "system:serviceaccount:"+in.Namespace+":e2e-job-maker"; got != want {
		t.Fatalf("created-by = %q, want the creating ServiceAccount %q", got, want)
	}
	for _, patch := range []string{
		`{"metadata":{"annotations":{"clipjob.paperclip.io/created-by":"` + server + `"}}}`,
		`{"metadata":{"annotations":{"clipjob.paperclip.io/created-by":null}}}`,
	} {
		for who, cs := range map[string]kubernetes.Interface{"the creator": maker, "cluster-admin": suite.cs} {
			_, err := cs.BatchV1().Jobs(in.Namespace).Patch(ctx, job.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "metadata.annotations[clipjob.paperclip.io/created-by]") || !strings.Contains(err.Error(), "is immutable") {
				t.Errorf("%s patching %s: want 403 naming the annotation, got %v", who, patch, err)
			}
		}
	}
}

func validateCounts(t *testing.T, in *harness.Install) []float64 {
	t.Helper()
	var out []float64
	for _, w := range in.Replicas() {
		v, err := w.Counter(`clipjob_admission_requests_total{dry_run="false",`, `webhook="validate"`)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func diff(a, b []float64) []float64 {
	out := make([]float64, len(b))
	for i := range b {
		out[i] = b[i] - a[i]
	}
	return out
}

// TestCheckGivesTheWebhooksVerdict runs `clipjob check` and the cluster on
// the same Jobs, with the Deployment, the namespace's Secrets and claims
// (exported as a List, as kubectl does) and the config the webhooks use:
// the verdicts and the denial text agree.
func TestCheckGivesTheWebhooksVerdict(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	dir := t.TempDir()
	dep, err := suite.cs.AppsV1().Deployments(in.Namespace).Get(ctx, "paperclip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep.APIVersion, dep.Kind = "apps/v1", "Deployment"
	// The namespace's Secrets and claims as one List, the way `kubectl get
	// secrets,pvc -o yaml` exports them, taken as all there is.
	objects := &corev1.List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	pvcs, err := suite.cs.CoreV1().PersistentVolumeClaims(in.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pvcs.Items {
		pvcs.Items[i].APIVersion, pvcs.Items[i].Kind = "v1", "PersistentVolumeClaim"
		objects.Items = append(objects.Items, rawOf(t, &pvcs.Items[i]))
	}
	secrets, err := suite.cs.CoreV1().Secrets(in.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range secrets.Items {
		secrets.Items[i].APIVersion, secrets.Items[i].Kind = "v1", "Secret"
		objects.Items = append(objects.Items, rawOf(t, &secrets.Items[i]))
	}

	good := in.BareJob(t, "e2e-check-good")
	evil := in.BareJob(t, "e2e-check-evil")
	evil.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "quay.io/evil/agent:2", Command: []string{"x"}}}
	rooted := in.BareJob(t, "e2e-check-hostpath")
	rooted.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}}}
	// Another run's Secret, named for this Job: the List must be read for
	// check to refuse it as the cluster does.
	foreign := in.BareJob(t, "e2e-check-foreign")
	foreign.Annotations = map[string]string{contract.AnnotationEnvSecret: foreign.Name + "-env"}
	foreignSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: foreign.Name + "-env", Namespace: in.Namespace,
		Labels: map[string]string{contract.LabelRunID: "another-run"}}}
	if _, err := suite.cs.CoreV1().Secrets(in.Namespace).Create(ctx, foreignSecret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	foreignSecret.APIVersion, foreignSecret.Kind = "v1", "Secret"
	objects.Items = append(objects.Items, rawOf(t, foreignSecret))

	for _, job := range []*batchv1.Job{good, evil, rooted, foreign} {
		job.APIVersion, job.Kind = "batch/v1", "Job"
		var out, errb bytes.Buffer
		code := app.Main([]string{"check", "-f", golden.WriteYAML(t, dir, job.Name+".yaml", job),
			"--source", golden.WriteYAML(t, dir, "dep.yaml", dep), "--objects", golden.WriteYAML(t, dir, "objects.yaml", objects), "--objects-complete",
			"--config", in.Webhook.ConfigFile}, nil, &out, &errb)
		_, werr := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job.DeepCopy(), metav1.CreateOptions{})
		cliAllowed := code == 0
		if cliAllowed != (werr == nil) {
			t.Errorf("%s: clipjob check exit %d (%s), cluster: %v", job.Name, code, strings.TrimSpace(out.String()), werr)
			continue
		}
		if werr != nil {
			_, verdict, _ := strings.Cut(strings.TrimSpace(out.String()), "): ")
			if !strings.Contains(werr.Error(), verdict) {
				t.Errorf("%s: the webhook said\n  %v\nclipjob check said\n  %s", job.Name, werr, verdict)
			}
		}
	}
}

// rawOf is obj as a List item.
func rawOf(t *testing.T, obj any) runtime.RawExtension {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: raw}
}

// TestAgentRunIsOnePod: a client cannot run several agent pods under one
// claim. Asking for parallel pods at create is overridden to one; raising
// parallelism on a running run, loosening the replacement policy, or
// selecting pods by hand is refused.
func TestAgentRunIsOnePod(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.BareJob(t, "e2e-one-pod")
	job.Spec.Parallelism, job.Spec.Completions = ptr.To[int32](6), ptr.To[int32](6)
	stored, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *stored.Spec.Parallelism != 1 || *stored.Spec.Completions != 1 || *stored.Spec.PodReplacementPolicy != batchv1.Failed {
		t.Fatalf("stored parallelism %d completions %d replacement %s", *stored.Spec.Parallelism, *stored.Spec.Completions, *stored.Spec.PodReplacementPolicy)
	}
	for _, tc := range []struct{ patch, want string }{
		{`{"spec":{"parallelism":6}}`, "spec.parallelism: Invalid value: 6"},
		{`{"spec":{"podReplacementPolicy":"TerminatingOrFailed"}}`, "spec.podReplacementPolicy"},
	} {
		_, err := suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, job.Name, types.MergePatchType, []byte(tc.patch), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("patch %s: want 403 naming %q, got %v", tc.patch, tc.want, err)
		}
	}

	manual := in.BareJob(t, "e2e-manual-selector")
	manual.Spec.ManualSelector = ptr.To(true)
	manual.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{contract.LabelRunID: manual.Name}}
	manual.Spec.Template.Labels = map[string]string{contract.LabelRunID: manual.Name}
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, manual, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "spec.manualSelector: Forbidden") {
		t.Errorf("manualSelector: want 403, got %v", err)
	}
	in.AssertNoJob(ctx, t, manual.Name)
}

// TestDeletedClaimDoesNotFreeTheAgent: the chart's ValidatingAdmissionPolicy
// refuses anyone but clipjob writing or deleting a claim Lease, even a
// cluster admin; and where that policy is not installed, whoever deletes
// an agent's claim while its run goes on does not get a second run in: the
// webhook also sees the agent's running Job.
func TestDeletedClaimDoesNotFreeTheAgent(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	first := in.BareJob(t, "e2e-claim-deleted")
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitPod(ctx, t, first.Name, harness.Running)
	key := claim.KeyFor(first, in.LoadConfig(t).Policy.Concurrency)
	leases := suite.cs.CoordinationV1().Leases(key.Namespace)
	// The API server applies a new admission policy a moment after it is
	// written: wait until it refuses a squatted claim (made and removed
	// while it does not yet) before trying the claim itself.
	squat := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "clipjob-agent-squatted", Namespace: key.Namespace}}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := leases.Create(ctx, squat, metav1.CreateOptions{})
		if err == nil {
			_ = leases.Delete(ctx, squat.Name, metav1.DeleteOptions{})
		}
		return apierrors.IsForbidden(err), nil
	}); err != nil {
		t.Fatalf("an admin creating a Lease named like a claim: never refused by the claim Lease policy: %v", err)
	}
	err := leases.Delete(ctx, key.Name, metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "written only by clipjob") {
		t.Fatalf("an admin deleting a claim Lease: want 403 from the claim Lease policy, got %v", err)
	}
	lease, err := leases.Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lease.Spec.HolderIdentity = ptr.To("someone/else")
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("an admin rewriting a claim Lease: want 403, got %v", err)
	}

	// Without the policy (an install that left it out).
	bindings := suite.cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if err := bindings.Delete(ctx, in.ClaimLeasePolicyName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := leases.Delete(ctx, key.Name, metav1.DeleteOptions{})
		return err == nil, nil // the API server drops the binding from its cache shortly
	})
	if err != nil {
		t.Fatal("the claim Lease could not be deleted with the policy unbound")
	}
	second := in.BareJob(t, "e2e-claim-deleted-2")
	second.Labels[contract.LabelAgentID] = first.Labels[contract.LabelAgentID]
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, second, metav1.CreateOptions{})
	if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "Job "+in.Namespace+"/"+first.Name) || !strings.Contains(err.Error(), "already has an active run") {
		t.Fatalf("a second run after the claim was deleted: want 409 naming %s, got %v", first.Name, err)
	}
	in.AssertNoJob(ctx, t, second.Name)
}

// TestARunThatCannotStartFreesItsAgent: a run whose pod no node takes
// keeps its agent busy only until its profile's startTimeoutSeconds; then
// the Job fails with DeadlineExceeded, says what its pod waited for, and
// the agent's next run is admitted.
func TestARunThatCannotStartFreesItsAgent(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	original := in.Config(t)
	in.WriteConfig(ctx, t, string(original)+"profiles:\n  claude_local:\n    startTimeoutSeconds: 3\n", true)
	stuck := in.BareJob(t, "e2e-never-starts")
	stuck.Spec.Template.Spec.NodeSelector = map[string]string{"clipjob.e2e/pool": "nowhere"}
	// A client's own record that the timeout was handled, and a deadline of
	// its own far away, change nothing.
	stuck.Annotations = map[string]string{contract.AnnotationStartTimeout: "none"}
	stuck.Spec.ActiveDeadlineSeconds = ptr.To[int64](100000)
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, stuck, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitPod(ctx, t, stuck.Name, func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})
	next := func() *batchv1.Job {
		j := in.BareJob(t, "e2e-never-starts-next")
		j.Labels[contract.LabelAgentID] = stuck.Labels[contract.LabelAgentID]
		return j
	}
	_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, next(), metav1.CreateOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("while the stuck run holds its agent: want 409, got %v", err)
	}
	// The API server passes clipjob's causes through: a client reads the
	// holder without parsing the message.
	if holder, ok := cause(err, contract.CauseHolderJob); !ok || holder != in.Namespace+"/"+stuck.Name {
		t.Errorf("409 from the API server: holder cause %q, want %s/%s (%v)", holder, in.Namespace, stuck.Name, err)
	}

	var ended *batchv1.Job
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, stuck.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ended = j
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the run that cannot start did not end: %v (conditions %+v, annotations %v)", err, ended.Status.Conditions, ended.Annotations)
	}
	for _, c := range ended.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Reason != batchv1.JobReasonDeadlineExceeded {
			t.Errorf("failed with reason %q, want %s", c.Reason, batchv1.JobReasonDeadlineExceeded)
		}
	}
	if why := ended.Annotations[contract.AnnotationStartTimeout]; !strings.Contains(why, "Unschedulable") || !strings.Contains(why, "3s") {
		t.Errorf("annotation %s = %q, want the timeout and what the pod waited for", contract.AnnotationStartTimeout, why)
	}
	// Putting the deadline back up, to hold the agent with the next pod, is
	// refused.
	_, err = suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, stuck.Name, types.MergePatchType, []byte(`{"spec":{"activeDeadlineSeconds":100000}}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "spec.activeDeadlineSeconds: Forbidden: may be lowered") {
		t.Errorf("raising the deadline the controller set: want 403, got %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, next(), metav1.CreateOptions{})
		if apierrors.IsConflict(err) {
			return false, nil // still busy
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("the agent was not freed after its stuck run ended: %v", err)
	}
}

// TestAgentLabelsCannotBeSmuggled: whatever carries a paperclip.io/ label
// goes through clipjob — a Job labeled otherwise whose pods carry the agent
// labels, a bare agent pod, and a container added to a running agent pod
// with kubectl debug are all refused.
func TestAgentLabelsCannotBeSmuggled(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	t.Run("a Job whose pods alone carry the agent labels", func(t *testing.T) {
		job := in.BareJob(t, "e2e-smuggled-template")
		job.Spec.Template.Labels = map[string]string{contract.LabelAgentID: "agent-x", contract.LabelRunID: "r", contract.LabelRole: contract.RoleAgent}
		job.Labels = map[string]string{"app": "not-an-agent"}
		job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
		job.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "evil.example.com/root:1",
			SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
		_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, job, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "metadata.labels[paperclip.io/agent-id]: Required value") {
			t.Fatalf("want 403, got %v", err)
		}
	})
	t.Run("a bare pod with the agent labels", func(t *testing.T) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e2e-smuggled-pod", Namespace: in.Namespace,
			Labels: map[string]string{contract.LabelAgentID: "agent-x", contract.LabelRunID: "r"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "evil.example.com/root:1"}}}}
		_, err := suite.cs.CoreV1().Pods(in.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "agent pods are made by the Job controller") {
			t.Fatalf("want 403, got %v", err)
		}
	})
	t.Run("kubectl debug on a running agent pod", func(t *testing.T) {
		if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-debugged"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := in.WaitPod(ctx, t, "e2e-debugged", harness.Running)
		pod.Spec.EphemeralContainers = append(pod.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox:1.36",
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}})
		_, err := suite.cs.CoreV1().Pods(in.Namespace).UpdateEphemeralContainers(ctx, pod.Name, pod, metav1.UpdateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "agent pods take no ephemeral containers") {
			t.Fatalf("want 403, got %v", err)
		}

		// What a pod belongs to is fixed after admission: relabelled, it
		// could pass as another run to the relay, or leave its Job, which
		// would make a second pod the claim does not count.
		for _, patch := range []struct{ body, want string }{
			{`{"metadata":{"labels":{"paperclip.io/run-id":"someone-elses-run"}}}`, "metadata.labels[paperclip.io/run-id]: Forbidden"},
			{`{"metadata":{"labels":{"batch.kubernetes.io/controller-uid":null}}}`, "metadata.labels[batch.kubernetes.io/controller-uid]: Forbidden"},
			{`{"metadata":{"labels":{"paperclip.io/agent-id":null,"paperclip.io/run-id":null,"paperclip.io/company-id":null,"paperclip.io/adapter-type":null,"paperclip.io/role":null,"paperclip.io/egress-profile":null}}}`, "metadata.labels[paperclip.io/agent-id]: Forbidden"},
		} {
			_, err := suite.cs.CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch.body), metav1.PatchOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), patch.want) {
				t.Errorf("patch %s: want 403 naming %q, got %v", patch.body, patch.want, err)
			}
		}
		if _, err := suite.cs.CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"blue"}}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("a label that says nothing of the run: %v", err)
		}
		// The status subresource takes metadata too.
		_, err = suite.cs.CoreV1().Pods(in.Namespace).Patch(ctx, pod.Name, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"paperclip.io/role":null,"paperclip.io/company-id":"evilcorp"}}}`), metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is fixed on an agent pod") {
			t.Errorf("relabelling an agent pod through its status: want 403, got %v", err)
		}
		_, err = suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, "e2e-debugged", types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"paperclip.io/agent-id":"someone-else"}}}`), metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is immutable") {
			t.Errorf("relabelling an agent Job through its status: want 403, got %v", err)
		}
	})
	t.Run("a plain pod adopted into a run by a patch", func(t *testing.T) {
		victim, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-adoption-victim"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e2e-adopted", Namespace: in.Namespace},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "evil", Image: "evil.example.com/root:1"}}}}
		if _, err := suite.cs.CoreV1().Pods(in.Namespace).Create(ctx, plain, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{"paperclip.io/run-id":%q},"ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":%q,"uid":%q,"controller":true}]}}`,
			victim.Labels[contract.LabelRunID], victim.Name, victim.UID)
		_, err = suite.cs.CoreV1().Pods(in.Namespace).Patch(ctx, plain.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is fixed on an agent pod") {
			t.Fatalf("adopting a plain pod into a run: want 403, got %v", err)
		}
		owners := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":%q,"uid":%q,"controller":true}]}}`, victim.Name, victim.UID)
		if _, err := suite.cs.CoreV1().Pods(in.Namespace).Patch(ctx, plain.Name, types.MergePatchType, []byte(owners), metav1.PatchOptions{}); err != nil {
			t.Errorf("an owner reference on a pod that is no agent pod is not clipjob's business: %v", err)
		}
	})
}

// TestWebhookOutage: with clipjob unreachable, agent Jobs fail closed, but
// ordinary Jobs and Pods are admitted (matchConditions are evaluated in the
// API server) and agent Jobs can still be deleted, which takes the garbage
// collector's updates.
func TestWebhookOutage(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	victim := in.BareJob(t, "e2e-outage-delete")
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.WaitPod(ctx, t, victim.Name, harness.Running)

	dead, _ := cluster.FreePorts(1)
	if err := in.Register(ctx, harness.RegisterOptions{Addr: fmt.Sprintf("127.0.0.1:%d", dead[0])}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Register(context.Background(), harness.RegisterOptions{}); err != nil {
			t.Error(err)
		}
	})

	plain := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "e2e-outage-plain", Namespace: in.Namespace, Labels: map[string]string{"app": "plain"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}}}}}
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Errorf("an ordinary Job waited on clipjob: %v", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e2e-outage-pod", Namespace: in.Namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}}}
	if _, err := suite.cs.CoreV1().Pods(in.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Errorf("an ordinary pod waited on clipjob: %v", err)
	}
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, in.BareJob(t, "e2e-outage-agent"), metav1.CreateOptions{}); err == nil {
		t.Error("an agent Job was admitted with clipjob down")
	}
	patch := []byte(`{"metadata":{"labels":{"paperclip.io/agent-id":"agent-other"}}}`)
	if _, err := suite.cs.BatchV1().Jobs(in.Namespace).Patch(ctx, victim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
		t.Error("an agent Job's labels changed with clipjob down")
	}

	if err := suite.cs.BatchV1().Jobs(in.Namespace).Delete(ctx, victim.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := suite.cs.BatchV1().Jobs(in.Namespace).Get(ctx, victim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatal("an agent Job could not be deleted while clipjob was down")
	}
}

// cause is the message of the API error's cause of type t, as a client
// reads clipjob's 409 causes.
func cause(err error, t metav1.CauseType) (string, bool) {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return "", false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Type == t {
			return c.Message, true
		}
	}
	return "", false
}
