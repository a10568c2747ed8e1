package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	crfake "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/golden"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
	"github.com/paperclipai/clipjob/templates"
)

func renderedCase(t testing.TB) (*batchv1.Job, *Validator, *fake.Clientset) {
	t.Helper()
	c := golden.Case(t, "alias-adapter-label")
	res, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	inh, _ := templates.InheritFromDeployment(c.Source, c.Config.Source)
	cs := fake.NewClientset(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "paperclip-data", Namespace: "paperclip"},
		Spec:       corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}},
	})
	v := &Validator{Configs: staticConfig{c.Config}, Sources: staticSource{inh: inh}, PVCs: livePVCs(cs), Claims: claim.NewLock(cs)}
	job := res.Job
	job.UID = types.UID("uid-" + job.Name)
	return job, v, cs
}

// rerender completes job again with the validator's config and source,
// as the mutating webhook would after a test changed it.
func rerender(t testing.TB, v *Validator, job *batchv1.Job) *batchv1.Job {
	t.Helper()
	cfg := v.Configs.Current()
	inh, _, err := v.Sources.Inherited(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := templates.Render(templates.Input{Job: job, Inherited: inh, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return res.Job
}

func validateRequest(t testing.TB, op admissionv1.Operation, job, old *batchv1.Job, dryRun bool) admission.Request {
	t.Helper()
	raw, _ := json.Marshal(job)
	req := createRequest(t, raw)
	req.Operation = op
	req.DryRun = ptr.To(dryRun)
	if old != nil {
		req.OldObject = runtime.RawExtension{Raw: mustJSON(old)}
	}
	return req
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func TestValidatorAdmitsThenRefusesSecondRun(t *testing.T) {
	job, v, cs := renderedCase(t)
	ctx := context.Background()
	if resp := v.Handle(ctx, validateRequest(t, admissionv1.Create, job, nil, false)); !resp.Allowed {
		t.Fatalf("rendered Job refused: %v", resp.Result.Message)
	}
	leases, _ := cs.CoordinationV1().Leases("paperclip").List(ctx, metav1.ListOptions{LabelSelector: claim.Label})
	if len(leases.Items) != 1 {
		t.Fatalf("%d claims written, want 1", len(leases.Items))
	}
	// The holder exists and runs.
	if _, err := cs.BatchV1().Jobs("paperclip").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := job.DeepCopy()
	second.Name, second.UID = "run-second", "uid-second"
	resp := v.Handle(ctx, validateRequest(t, admissionv1.Create, second, nil, false))
	if resp.Allowed || resp.Result.Code != http.StatusConflict || resp.Result.Reason != metav1.StatusReasonConflict {
		t.Fatalf("second run: allowed %v code %d", resp.Allowed, resp.Result.Code)
	}
	if !strings.Contains(resp.Result.Message, `already has an active run: Job paperclip/`+job.Name+` (run run-01jd8x)`) {
		t.Errorf("409 message %q does not name the active Job", resp.Result.Message)
	}
	// A program reads the holder from the causes, not the prose.
	causes := map[metav1.CauseType]string{}
	if resp.Result.Details != nil {
		for _, c := range resp.Result.Details.Causes {
			causes[c.Type] = c.Message
		}
	}
	if causes[contract.CauseHolderJob] != "paperclip/"+job.Name || causes[contract.CauseHolderRunID] != "run-01jd8x" || causes[contract.CauseAgentBusy] == "" {
		t.Errorf("409 causes %v: want the holder's Job and run id", causes)
	}
	if _, present := causes[contract.CauseHolderSince]; !present {
		t.Error("409 causes lack holder-since")
	}
}

// A validator missing a lookup cannot judge a Job that needs it: the
// request fails (500) instead of being admitted with a rule skipped.
func TestValidatorWithoutALookupFailsTheRequest(t *testing.T) {
	job, v, _ := renderedCase(t)
	job.Annotations[contract.AnnotationEnvSecret] = job.Name + "-env"
	job = rerender(t, v, job) // as clipjob completes a Job naming an env Secret
	v.Secrets = nil
	resp := v.Handle(context.Background(), validateRequest(t, admissionv1.Create, job, nil, false))
	if resp.Allowed || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, "could not judge the Job: Secret paperclip/"+job.Name+"-env was not given") {
		t.Errorf("allowed %v, %d %q", resp.Allowed, resp.Result.Code, resp.Result.Message)
	}
}

func TestValidatorDryRunWritesNoClaim(t *testing.T) {
	job, v, cs := renderedCase(t)
	ctx := context.Background()
	if resp := v.Handle(ctx, validateRequest(t, admissionv1.Create, job, nil, true)); !resp.Allowed {
		t.Fatal(resp.Result.Message)
	}
	// The fake clientset stores dry runs anyway; what matters is that the
	// write went to the API server as a dry run.
	creates := 0
	for _, a := range cs.Actions() {
		if c, ok := a.(clienttesting.CreateActionImpl); ok && a.GetResource().Resource == "leases" {
			creates++
			if len(c.CreateOptions.DryRun) != 1 || c.CreateOptions.DryRun[0] != metav1.DryRunAll {
				t.Errorf("lease created without dryRun=All: %+v", c.CreateOptions)
			}
		}
	}
	if creates != 1 {
		t.Errorf("%d lease creates, want 1 (dry run)", creates)
	}
}

func TestValidatorOutcomes(t *testing.T) {
	job, v, _ := renderedCase(t)
	ctx := context.Background()

	evil := job.DeepCopy()
	evil.Spec.Template.Spec.Containers[0].Image = "evil.example.com/x:1"
	relabeled := job.DeepCopy()
	relabeled.Labels[contract.LabelAgentID] = "someone-else"
	unlabeled := job.DeepCopy()
	delete(unlabeled.Labels, contract.LabelAgentID)
	// An ordinary Job: no paperclip.io/ label anywhere.
	plain := jobs.MakeJob("plain", "paperclip").Label("app", "x").Container("c", "busybox:1.36").Obj()
	// Agent labels on the pods only, the Job labeled otherwise: the API
	// server does not copy the template's labels then.
	podsOnly := job.DeepCopy()
	podsOnly.Labels = map[string]string{"app": "x"}

	failingPVCs := *v
	failingPVCs.PVCs = func(context.Context, string, string) (*corev1.PersistentVolumeClaim, error) {
		return nil, errors.New("etcdserver: request timed out")
	}
	sourceAway := *v
	sourceAway.Sources = staticSource{err: &templates.SourceError{Source: "paperclip/paperclip", Reason: "not found"}}
	tests := []struct {
		name     string
		v        *Validator
		req      admission.Request
		allowed  bool
		code     int32
		contains string
	}{
		{"image denied", v, validateRequest(t, admissionv1.Create, evil, nil, false), false, http.StatusForbidden, `image "evil.example.com/x:1"`},
		{"agent relabeled on update", v, validateRequest(t, admissionv1.Update, relabeled, job, false), false, http.StatusForbidden, "is immutable"},
		{"label removed on update", v, validateRequest(t, admissionv1.Update, unlabeled, job, false), false, http.StatusForbidden, "is immutable"},
		{"plain Job skipped", v, validateRequest(t, admissionv1.Create, plain, nil, false), true, http.StatusOK, "not an agent Job"},
		{"agent labels on the pods only", v, validateRequest(t, admissionv1.Create, podsOnly, nil, false), false, http.StatusForbidden,
			"metadata.labels[paperclip.io/agent-id]: Required value"},
		{"delete skipped", v, validateRequest(t, admissionv1.Delete, job, nil, false), true, http.StatusOK, "CREATE and UPDATE only"},
		{"lookup failure is an error, not a denial", &failingPVCs, validateRequest(t, admissionv1.Create, job, nil, false), false, http.StatusInternalServerError, "request timed out"},
		// A plain suspended Job (no webhook saw its CREATE) given agent
		// labels on its pods and unsuspended in one patch.
		{"a Job turned into an agent run by an update", v, validateRequest(t, admissionv1.Update, podsOnly, plain, false), false, http.StatusForbidden,
			"a Job becomes an agent run only at its CREATE"},
		// Without the source the Job cannot be rendered again: 503, not a
		// handler panic on a verdict with no rules run.
		{"source away", &sourceAway, validateRequest(t, admissionv1.Create, job, nil, false), false, http.StatusServiceUnavailable,
			"clipjob cannot check that this Job is as clipjob completes it"},
		{"malformed old object", v, func() admission.Request {
			r := validateRequest(t, admissionv1.Update, job, nil, false)
			r.OldObject.Raw = []byte(`{`)
			return r
		}(), false, http.StatusBadRequest, "old object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := tt.v.Handle(ctx, tt.req)
			if resp.Allowed != tt.allowed || resp.Result.Code != tt.code || !strings.Contains(resp.Result.Message, tt.contains) {
				t.Errorf("allowed %v code %d message %q; want %v %d containing %q",
					resp.Allowed, resp.Result.Code, resp.Result.Message, tt.allowed, tt.code, tt.contains)
			}
		})
	}
}

// The PVC check reads the cache and asks live only on a miss: a PVC
// created just before its Job, not yet cached, must not refuse the Job,
// and a cached PVC must not cost a round trip.
func TestCachedPVCsFallBackToLiveOnAMiss(t *testing.T) {
	rwx := func(name string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "paperclip"},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}}}
	}
	cached := crfake.NewClientBuilder().WithObjects(rwx("cached")).Build()
	live := fake.NewClientset(rwx("cached"), rwx("just-created"))
	get := cachedPVCs(cached, livePVCs(live))
	ctx := context.Background()

	if _, err := get(ctx, "paperclip", "cached"); err != nil {
		t.Fatal(err)
	}
	if n := len(live.Actions()); n != 0 {
		t.Fatalf("a cached PVC cost %d live reads", n)
	}
	pvc, err := get(ctx, "paperclip", "just-created")
	if err != nil || pvc.Name != "just-created" {
		t.Fatalf("a PVC missing from the cache but on the API server: %v, %v", pvc, err)
	}
	if _, err := get(ctx, "paperclip", "nowhere"); !apierrors.IsNotFound(err) {
		t.Fatalf("a PVC nowhere: want NotFound from the live read, got %v", err)
	}
	if n := len(live.Actions()); n != 2 {
		t.Fatalf("misses made %d live reads, want 2", n)
	}
}

// The PVC cache keeps what the volume rule reads and nothing else: a
// PVC's annotations, labels and managed fields (any namespace's, clipjob
// serves or not) do not stay in the webhook's memory.
func TestPVCCacheKeepsOnlyWhatThePolicyReads(t *testing.T) {
	in := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "paperclip", UID: "u", ResourceVersion: "7",
			Annotations: map[string]string{"big": strings.Repeat("x", 1<<16)}, Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			VolumeName: "pv-1", DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "paperclip-data"}},
	}
	out, err := pvcEssentials(in)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.PersistentVolumeClaim)
	if got.Name != "data" || got.Namespace != "paperclip" || got.ResourceVersion != "7" || len(got.Spec.AccessModes) != 1 || got.Spec.DataSource == nil {
		t.Fatalf("lost what the policy reads: %+v", got)
	}
	if got.Annotations != nil || got.Labels != nil || got.ManagedFields != nil || got.Spec.VolumeName != "" {
		t.Errorf("kept more than the policy reads: %+v", got)
	}
}

// A run created suspended holds no claim, in Reject mode as in Queue mode:
// it runs nothing, and a claim taken at its CREATE made its agent busy
// with a run that might never start (one a stale compiled Queue-mode
// policy suspended and the Reject-mode webhook admitted). Its unsuspend
// takes the claim, so it still cannot start beside another run.
func TestASuspendedCreateTakesItsClaimWhenItStarts(t *testing.T) {
	job, v, cs := renderedCase(t)
	ctx := context.Background()
	if v.Configs.Current().Policy.Concurrency.Mode != config.ModeReject {
		t.Fatal("the fixture's config is not in Reject mode")
	}
	if resp := v.Handle(ctx, validateRequest(t, admissionv1.Create, job, nil, false)); !resp.Allowed {
		t.Fatalf("the first run refused: %v", resp.Result.Message)
	}
	if _, err := cs.BatchV1().Jobs("paperclip").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	paused := job.DeepCopy()
	paused.Name, paused.UID = "run-paused", "uid-paused"
	paused.Spec.Suspend = ptr.To(true)
	paused = rerender(t, v, paused)
	paused.UID = "uid-paused"
	resp := v.Handle(ctx, validateRequest(t, admissionv1.Create, paused, nil, false))
	if !resp.Allowed {
		t.Fatalf("a suspended run of a busy agent: want it admitted without a claim (it runs nothing), got %d %s", resp.Result.Code, resp.Result.Message)
	}
	leases, _ := cs.CoordinationV1().Leases("paperclip").List(ctx, metav1.ListOptions{LabelSelector: claim.Label})
	if len(leases.Items) != 1 || claim.HolderOf(&leases.Items[0]).UID != string(job.UID) {
		t.Fatalf("the claim is not the running run's alone: %+v", leases.Items)
	}
	started := paused.DeepCopy()
	started.Spec.Suspend = ptr.To(false)
	resp = v.Handle(ctx, validateRequest(t, admissionv1.Update, started, paused, false))
	if resp.Allowed || resp.Result.Code != http.StatusConflict {
		t.Fatalf("starting it while the agent runs another: want 409, got allowed %v, %d %s", resp.Allowed, resp.Result.Code, resp.Result.Message)
	}
}

// The whole path of a Job a stale compiled Queue-mode policy completed,
// through the Reject-mode webhooks: it is stored running, holding its
// agent's claim as any run, not suspended with nothing to start it.
func TestAStaleQueuePolicysJobIsStoredRunning(t *testing.T) {
	c := golden.Case(t, "alias-adapter-label")
	queued, err := templates.Render(templates.Input{Job: c.Job, Inherited: mustInherit(t, c), Config: c.Config.InMode(config.ModeQueue)})
	if err != nil {
		t.Fatal(err)
	}
	_, v, cs := renderedCase(t)
	m := &Mutator{Configs: v.Configs, Sources: v.Sources}
	raw := mustJSON(queued.Job)
	resp := m.Handle(context.Background(), createRequest(t, raw))
	if !resp.Allowed {
		t.Fatalf("mutating webhook refused it: %v", resp.Result.Message)
	}
	stored := queued.Job
	if len(resp.Patches) > 0 {
		stored = applyPatch(t, raw, resp)
	}
	stored.UID = "uid-stale"
	if resp := v.Handle(context.Background(), validateRequest(t, admissionv1.Create, stored, nil, false)); !resp.Allowed {
		t.Fatalf("validating webhook refused it: %v", resp.Result.Message)
	}
	if contract.Suspended(stored) {
		t.Errorf("stored suspended and unmarked (queued %q): a run the claim controller never starts", stored.Annotations[contract.AnnotationQueued])
	}
	leases, _ := cs.CoordinationV1().Leases("paperclip").List(context.Background(), metav1.ListOptions{LabelSelector: claim.Label})
	if len(leases.Items) != 1 || claim.HolderOf(&leases.Items[0]).UID != "uid-stale" {
		t.Errorf("the run does not hold its agent's claim: %+v", leases.Items)
	}
}

func mustInherit(t testing.TB, c golden.Fixture) *templates.Inherited {
	t.Helper()
	inh, err := templates.InheritFromDeployment(c.Source, c.Config.Source)
	if err != nil {
		t.Fatal(err)
	}
	return inh
}
