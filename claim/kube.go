package claim

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/paperclipai/clipjob/config"
)

// The adapters below reach the API server live, never through a cache: a
// claim decision must see what the API server has now.

type leaseAPI struct{ cs kubernetes.Interface }

var _ LeaseAPI = leaseAPI{}

func dryRunOpt(dryRun bool) []string {
	if dryRun {
		return []string{metav1.DryRunAll}
	}
	return nil
}

func (l leaseAPI) Get(ctx context.Context, ns, name string) (*coordinationv1.Lease, error) {
	return l.cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
}

func (l leaseAPI) Create(ctx context.Context, lease *coordinationv1.Lease, dryRun bool) (*coordinationv1.Lease, error) {
	return l.cs.CoordinationV1().Leases(lease.Namespace).Create(ctx, lease, metav1.CreateOptions{DryRun: dryRunOpt(dryRun)})
}

func (l leaseAPI) Update(ctx context.Context, lease *coordinationv1.Lease, dryRun bool) (*coordinationv1.Lease, error) {
	return l.cs.CoordinationV1().Leases(lease.Namespace).Update(ctx, lease, metav1.UpdateOptions{DryRun: dryRunOpt(dryRun)})
}

func (l leaseAPI) Delete(ctx context.Context, ns, name, rv string) error {
	return l.cs.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{ResourceVersion: ptr.To(rv)},
	})
}

func (l leaseAPI) List(ctx context.Context, namespace string) ([]coordinationv1.Lease, error) {
	list, err := l.cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: Label + "=" + KindAgentRun,
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

type jobAPI struct{ cs kubernetes.Interface }

var _ JobAPI = jobAPI{}

func (j jobAPI) Get(ctx context.Context, ns, name string) (*batchv1.Job, error) {
	return j.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
}

type podsAPI struct{ cs kubernetes.Interface }

var _ PodsAPI = podsAPI{}

// Running counts the Job's pods (by the controller-uid label the Job
// controller sets) that have not succeeded or failed.
func (p podsAPI) Running(ctx context.Context, ns, jobUID string) (int, error) {
	list, err := p.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.ControllerUidLabel + "=" + jobUID})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pod := range list.Items {
		if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			n++
		}
	}
	return n, nil
}

// NewLock returns the lock backed by the API server, counting lost write
// races in clipjob_claim_retries_total.
func NewLock(cs kubernetes.Interface) *Lock {
	return &Lock{Leases: leaseAPI{cs}, Jobs: jobAPI{cs}, Pods: podsAPI{cs}, OnRetry: func() { retries.Inc() }}
}

// CachedActiveRuns lists an agent's Jobs from r, the manager's cache with
// the IndexAgent index (see Controller.SetupWithManager).
func CachedActiveRuns(r client.Reader) ActiveRuns {
	return func(ctx context.Context, key Key, cfg config.Concurrency) ([]batchv1.Job, error) {
		return listAgentJobs(ctx, r, key.Namespace, key.Agent, cfg)
	}
}

// listAgentJobs lists the agent's Jobs in the claim's scope: namespace ns,
// or every namespace for scope Cluster.
func listAgentJobs(ctx context.Context, r client.Reader, ns, agent string, cfg config.Concurrency) ([]batchv1.Job, error) {
	opts := []client.ListOption{client.MatchingFields{IndexAgent: agent}}
	if cfg.Scope != config.ScopeCluster {
		opts = append(opts, client.InNamespace(ns))
	}
	var list batchv1.JobList
	if err := r.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("listing the Jobs of agent %q: %w", agent, err)
	}
	return list.Items, nil
}
