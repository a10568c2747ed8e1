package runsecret

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	crfake "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/testing/jobs"
)

type fakeSecrets map[string]*metav1.ObjectMeta

func (f fakeSecrets) Metadata(_ context.Context, ns, name string) (*metav1.ObjectMeta, error) {
	if m, ok := f[ns+"/"+name]; ok {
		return m, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
}

func (f fakeSecrets) AddOwner(_ context.Context, ns, name string, owner metav1.OwnerReference) error {
	f[ns+"/"+name].OwnerReferences = append(f[ns+"/"+name].OwnerReferences, owner)
	return nil
}

func secret(name string, labels map[string]string) *metav1.ObjectMeta {
	return &metav1.ObjectMeta{Name: name, Namespace: "paperclip", Labels: labels}
}

func reconcileJob(t *testing.T, job *batchv1.Job, secrets fakeSecrets) {
	t.Helper()
	r := &Reconciler{Jobs: crfake.NewClientBuilder().WithObjects(job).Build(), Secrets: secrets, Log: logr.Discard()}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: job.Namespace, Name: job.Name}}); err != nil {
		t.Fatal(err)
	}
}

func owners(m *metav1.ObjectMeta) []types.UID {
	var out []types.UID
	for _, o := range m.OwnerReferences {
		out = append(out, o.UID)
	}
	return out
}

// The Job owns the Secrets labeled for its run, once, and no other.
func TestAJobOwnsItsRunSecrets(t *testing.T) {
	job := jobs.MakeJob("run-1", "paperclip").Agent("a").Run("run-1").
		Annotation(contract.AnnotationEnvSecret, "run-1-env").Prompt("").Obj()
	job.Spec.Template.Annotations = map[string]string{contract.AnnotationPromptSecret: "run-1-prompt/text"}
	run := map[string]string{contract.LabelRunID: "run-1", contract.LabelAgentID: "a"}
	secrets := fakeSecrets{
		"paperclip/run-1-env":    secret("run-1-env", run),
		"paperclip/run-1-prompt": secret("run-1-prompt", run),
	}
	reconcileJob(t, job, secrets)
	reconcileJob(t, job, secrets) // again: nothing more
	for _, name := range []string{"run-1-env", "run-1-prompt"} {
		got := secrets["paperclip/"+name]
		if o := owners(got); len(o) != 1 || o[0] != job.UID {
			t.Errorf("%s owners %v, want exactly the Job", name, o)
		}
		if ref := got.OwnerReferences[0]; ref.Kind != "Job" || ref.APIVersion != "batch/v1" || ref.Name != "run-1" || ref.Controller != nil {
			t.Errorf("%s owner reference %+v", name, ref)
		}
	}
}

// A Secret that is not labeled for the run is never taken: owning it
// would delete it with the Job, and a Job's annotations can be changed
// after admission to name the server's own.
func TestASecretNotMadeForTheRunIsLeftAlone(t *testing.T) {
	job := jobs.MakeJob("run-2", "paperclip").Agent("a").Run("run-2").Annotation(contract.AnnotationEnvSecret, "llm-keys").Obj()
	for name, labels := range map[string]map[string]string{
		"the server's":  {"app": "paperclip"},
		"another run's": {contract.LabelRunID: "run-9"},
		// A run id is the client's: the same one under another agent.
		"another agent's run of that id": {contract.LabelRunID: "run-2", contract.LabelAgentID: "victim"},
	} {
		secrets := fakeSecrets{"paperclip/llm-keys": secret("llm-keys", labels)}
		reconcileJob(t, job, secrets)
		if o := owners(secrets["paperclip/llm-keys"]); len(o) != 0 {
			t.Errorf("%s Secret taken by the Job: owners %v", name, o)
		}
	}
	reconcileJob(t, job, fakeSecrets{}) // missing: nothing to do, no error
}

// A shared Secret is never taken, even labeled for the run: its Job would
// delete what every run reads. One named for the Job with the run id
// alone (as Paperclip's adapters label theirs) is taken.
func TestASharedSecretIsNeverTaken(t *testing.T) {
	job := jobs.MakeJob("run-2", "paperclip").Agent("a").Run("run-2").Annotation(contract.AnnotationEnvSecret, "llm-key").Obj()
	job.UID = "uid-2"
	secrets := fakeSecrets{"paperclip/llm-key": secret("llm-key", map[string]string{contract.LabelRunID: "run-2", contract.LabelAgentID: "a"})}
	r := &Reconciler{Jobs: crfake.NewClientBuilder().WithObjects(job).Build(), Secrets: secrets, Log: logr.Discard(),
		Shared: func(name string) bool { return name == "llm-key" }}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "paperclip", Name: "run-2"}}); err != nil {
		t.Fatal(err)
	}
	if got := owners(secrets["paperclip/llm-key"]); len(got) != 0 {
		t.Errorf("a shared Secret was taken by %v", got)
	}
	job2 := jobs.MakeJob("run-3", "paperclip").Agent("a").Run("run-3").Annotation(contract.AnnotationEnvSecret, "run-3-env").Obj()
	job2.UID = "uid-3"
	secrets["paperclip/run-3-env"] = secret("run-3-env", map[string]string{contract.LabelRunID: "run-3"})
	secrets["paperclip/run-3-x-env"] = secret("run-3-x-env", map[string]string{contract.LabelRunID: "run-3"})
	reconcileJob(t, job2, secrets)
	if got := owners(secrets["paperclip/run-3-env"]); len(got) != 1 || got[0] != "uid-3" {
		t.Errorf("a Secret named for its Job and labeled with its run: owners %v", got)
	}
}

// A Secret named by the Job but made after it (policy.secrets.
// createdAfterJob) is looked for again while the run lasts, and owned once
// it is there; once the run is over, nobody waits for it.
func TestASecretMadeAfterItsJobIsTakenWhenItAppears(t *testing.T) {
	job := jobs.MakeJob("run-4", "paperclip").Agent("a").Run("run-4").Annotation(contract.AnnotationEnvSecret, "run-4-env").Obj()
	job.UID = "uid-4"
	secrets := fakeSecrets{}
	r := &Reconciler{Jobs: crfake.NewClientBuilder().WithObjects(job).Build(), Secrets: secrets, Log: logr.Discard(), MissingRetry: time.Minute}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "paperclip", Name: "run-4"}}
	res, err := r.Reconcile(context.Background(), req)
	if err != nil || res.RequeueAfter != time.Minute {
		t.Fatalf("the Secret not there yet: %+v, %v; want a look again in a minute", res, err)
	}
	secrets["paperclip/run-4-env"] = secret("run-4-env", map[string]string{contract.LabelRunID: "run-4"})
	if res, err = r.Reconcile(context.Background(), req); err != nil || res.RequeueAfter != 0 {
		t.Fatalf("the Secret there: %+v, %v", res, err)
	}
	if got := owners(secrets["paperclip/run-4-env"]); len(got) != 1 || got[0] != "uid-4" {
		t.Errorf("owners %v", got)
	}

	done := jobs.MakeJob("run-5", "paperclip").Agent("a").Run("run-5").Annotation(contract.AnnotationEnvSecret, "run-5-env").Obj()
	done.UID = "uid-5"
	done.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	r.Jobs = crfake.NewClientBuilder().WithObjects(done).Build()
	res, err = r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "paperclip", Name: "run-5"}})
	if err != nil || res.RequeueAfter != 0 {
		t.Errorf("a finished run's missing Secret: %+v, %v; want no retry", res, err)
	}
}

func TestNames(t *testing.T) {
	job := jobs.MakeJob("j", "ns").Annotation(contract.AnnotationEnvSecret, "env").Obj()
	job.Spec.Template.Annotations = map[string]string{contract.AnnotationPromptSecret: "prompt"}
	if got := Names(job); len(got) != 2 || got[0] != "env" || got[1] != "prompt" {
		t.Errorf("Names %v", got)
	}
	if got := Names(jobs.MakeJob("j", "ns").Obj()); len(got) != 0 {
		t.Errorf("a Job naming none: %v", got)
	}
}

// A Secret another run's Job already owns is not taken by a second Job
// with the same run id: it would outlive its run.
func TestASecretOwnedByAnotherJobIsLeftAlone(t *testing.T) {
	job := jobs.MakeJob("thief", "paperclip").Agent("a").Run("run-x").Annotation(contract.AnnotationEnvSecret, "run-x-env").Obj()
	meta := secret("run-x-env", map[string]string{contract.LabelRunID: "run-x", contract.LabelAgentID: "a"})
	meta.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "victim", UID: "uid-victim"}}
	secrets := fakeSecrets{"paperclip/run-x-env": meta}
	reconcileJob(t, job, secrets)
	if o := owners(meta); len(o) != 1 || o[0] != "uid-victim" {
		t.Errorf("owners %v, want only the victim's Job", o)
	}
}
