package claim

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/config"
)

// Release frees the claim job holds, if it holds one. The controller calls
// it when a Job finishes or is deleted, so the next run of the agent does
// not wait for anything. Deleting only at the observed resourceVersion
// means a claim taken over meanwhile is left alone.
func (c *Lock) Release(ctx context.Context, job *batchv1.Job, cfg config.Concurrency) (bool, error) {
	key := KeyFor(job, cfg)
	lease, err := c.Leases.Get(ctx, key.Namespace, key.Name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if h := HolderOf(lease); h.UID != string(job.UID) || h.Namespace != job.Namespace || h.Name != job.Name {
		return false, nil
	}
	if c.Pods != nil {
		if n, err := c.Pods.Running(ctx, job.Namespace, string(job.UID)); err != nil || n > 0 {
			return false, err // not yet: the caller retries, the sweep catches it
		}
	}
	err = c.Leases.Delete(ctx, key.Namespace, key.Name, lease.ResourceVersion)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return false, nil
	}
	return err == nil, err
}

// Sweep deletes every claim whose holder no longer runs: finished, being
// deleted, replaced, or never stored within grace. It catches what Release
// missed (the controller was down, the Job was deleted during a restart).
// It looks only in namespaces, or in every namespace when there are none:
// a release narrowed to its own namespaces leaves other releases' claims
// to them (its RBAC could not delete them anyway).
func (c *Lock) Sweep(ctx context.Context, grace time.Duration, namespaces []string) (int, error) {
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var leases []coordinationv1.Lease
	for _, ns := range namespaces {
		l, err := c.Leases.List(ctx, ns)
		if err != nil {
			return 0, err
		}
		leases = append(leases, l...)
	}
	released := 0
	for i := range leases {
		l := &leases[i]
		if l.Labels[Label] != KindAgentRun {
			continue
		}
		free, _, err := c.free(ctx, l, grace)
		if err != nil || !free {
			continue
		}
		err = c.Leases.Delete(ctx, l.Namespace, l.Name, l.ResourceVersion)
		if err == nil {
			released++
		}
	}
	return released, nil
}
