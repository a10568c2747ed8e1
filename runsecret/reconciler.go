package runsecret

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/contract"
)

// SecretAPI is what the reconciler needs of Secrets: their metadata, never
// their data, and adding an owner reference.
type SecretAPI interface {
	Metadata(ctx context.Context, namespace, name string) (*metav1.ObjectMeta, error)
	AddOwner(ctx context.Context, namespace, name string, owner metav1.OwnerReference) error
}

// Names returns the Secrets a Job names for its run: its env Secret and
// its prompt Secret.
func Names(job *batchv1.Job) []string {
	var names []string
	if n := job.Annotations[contract.AnnotationEnvSecret]; n != "" {
		names = append(names, n)
	}
	if ref := job.Spec.Template.Annotations[contract.AnnotationPromptSecret]; ref != "" {
		n, _, _ := strings.Cut(ref, "/")
		names = append(names, n)
	}
	return names
}

// Reconciler gives each agent Job its run's Secrets.
type Reconciler struct {
	// Jobs reads agent Jobs from the manager's cache.
	Jobs    client.Reader
	Secrets SecretAPI
	// Shared reports whether the operator shares a Secret among runs
	// (config policy.secrets.shared): such a Secret is never a run's to
	// own, whatever its labels say. Nil shares none.
	Shared func(name string) bool
	// MissingRetry is how soon a Job that names a Secret not there yet is
	// looked at again, until the Secret appears or the Job ends: a client
	// may create its run's Secret after the Job (policy.secrets.
	// createdAfterJob), and Jobs are reconciled on create only. Default
	// 15s.
	MissingRetry time.Duration
	Log          logr.Logger
}

// Reconcile implements reconcile.Reconciler, keyed by Job.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var job batchv1.Job
	if err := r.Jobs.Get(ctx, req.NamespacedName, &job); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if job.DeletionTimestamp != nil || job.UID == "" {
		return reconcile.Result{}, nil
	}
	run := job.Labels[contract.LabelRunID]
	owner := metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID}
	var result reconcile.Result
	for _, name := range Names(&job) {
		meta, err := r.Secrets.Metadata(ctx, job.Namespace, name)
		switch {
		case apierrors.IsNotFound(err) && !claim.Finished(&job):
			// Not made yet (or deleted since): look again while the run
			// lasts, so a Secret made after its Job goes with it too.
			result.RequeueAfter = cmp.Or(r.MissingRetry, 15*time.Second)
			continue
		case apierrors.IsNotFound(err):
			continue // the run is over: nothing to own
		case err != nil:
			return reconcile.Result{}, fmt.Errorf("reading Secret %s/%s: %w", job.Namespace, name, err)
		case r.Shared != nil && r.Shared(name):
			r.Log.Info("not taking a shared Secret (policy.secrets.shared): its runs' Jobs would delete it", "job", job.Namespace+"/"+job.Name, "secret", name)
			continue
		case run == "" || !contract.SecretMadeForRun(job.Name, job.Labels, name, meta.Labels):
			r.Log.Info("not taking a Secret that is not labeled for the run", "job", job.Namespace+"/"+job.Name,
				"secret", name, "want", run+" of "+job.Labels[contract.LabelAgentID],
				"has", meta.Labels[contract.LabelRunID]+" of "+meta.Labels[contract.LabelAgentID])
			continue
		case ownedBy(meta, job.UID):
			continue
		case ownedByAnotherJob(meta, job.UID):
			r.Log.Info("not taking a Secret another Job owns", "job", job.Namespace+"/"+job.Name, "secret", name)
			continue
		}
		if err := r.Secrets.AddOwner(ctx, job.Namespace, name, owner); err != nil {
			return reconcile.Result{}, fmt.Errorf("making Job %s/%s own Secret %s: %w", job.Namespace, job.Name, name, err)
		}
		r.Log.V(1).Info("run Secret now owned by its Job", "job", job.Namespace+"/"+job.Name, "secret", name)
	}
	return result, nil
}

// ownedByAnotherJob: a run's Secret belongs to one run's Job; a second
// owner would keep it past its run.
func ownedByAnotherJob(meta *metav1.ObjectMeta, uid types.UID) bool {
	for _, o := range meta.OwnerReferences {
		if o.Kind == "Job" && o.UID != uid {
			return true
		}
	}
	return false
}

func ownedBy(meta *metav1.ObjectMeta, uid types.UID) bool {
	for _, o := range meta.OwnerReferences {
		if o.UID == uid {
			return true
		}
	}
	return false
}

// namesSecrets selects the Jobs that name a run Secret, on create (and a
// new leader's first list, which replays creates).
var namesSecrets = predicate.Funcs{
	CreateFunc:  func(e event.CreateEvent) bool { return len(Names(e.Object.(*batchv1.Job))) > 0 },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// SetupWithManager registers the reconciler on mgr, whose cache holds
// agent Jobs.
func (r *Reconciler) SetupWithManager(mgr manager.Manager) error {
	return builder.ControllerManagedBy(mgr).Named("run-secrets").
		For(&batchv1.Job{}, builder.WithPredicates(namesSecrets)).
		Complete(r)
}
