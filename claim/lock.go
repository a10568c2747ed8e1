package claim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
)

// Labels and annotations of claim Leases.
const (
	Label            = "clipjob.paperclip.io/claim"
	KindAgentRun     = "agent-run"
	AnnotationJobUID = "clipjob.paperclip.io/job-uid"
	AnnotationRunID  = "clipjob.paperclip.io/run-id"
	AnnotationAgent  = "clipjob.paperclip.io/agent-id"
)

// LeaseAPI is the slice of the coordination API the claims need. Writes
// take dryRun so a dry-run admission checks without writing.
type LeaseAPI interface {
	Get(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, dryRun bool) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, dryRun bool) (*coordinationv1.Lease, error)
	// Delete removes a lease only if it is still at resourceVersion.
	Delete(ctx context.Context, namespace, name, resourceVersion string) error
	// List returns the claims in namespace, every namespace's when it is
	// empty.
	List(ctx context.Context, namespace string) ([]coordinationv1.Lease, error)
}

// JobAPI reads Jobs live (not from a cache: a claim decision must see
// what the API server has now).
type JobAPI interface {
	Get(ctx context.Context, namespace, name string) (*batchv1.Job, error)
}

// PodsAPI counts a Job's pods that have not finished, whatever became of
// the Job: a Job deleted in the background, or marked Failed, can leave
// pods still terminating, and they still write to the shared volume.
type PodsAPI interface {
	Running(ctx context.Context, namespace, jobUID string) (int, error)
}

// Lock grants at most one active run per agent: the run holds the agent's
// claim, a Lease written only through Acquire's read-decide-write loop.
type Lock struct {
	Leases LeaseAPI
	Jobs   JobAPI
	// Pods, when set, keeps a claim until its Job's pods are gone.
	Pods PodsAPI
	// Clock is the time source. Default the real clock.
	Clock clock.PassiveClock
	// MaxAttempts bounds the read-decide-write loop under write conflicts.
	// Default 8.
	MaxAttempts int
	// OnRetry is called when a write lost a race and the loop goes again.
	OnRetry func()
	// Active, when set, lists the agent's Jobs from a cache. Acquire then
	// also refuses while another of them runs, which a Lease alone cannot
	// see if the Lease was deleted, or the claim's scope or mode changed,
	// while that run went on. The cache lags; the Lease closes that window.
	Active ActiveRuns
}

// ActiveRuns lists the Jobs of the agent of key in the claim's scope: its
// namespace, or every namespace for scope Cluster.
type ActiveRuns func(ctx context.Context, key Key, cfg config.Concurrency) ([]batchv1.Job, error)

// BusyError says an agent has an active run. The webhook answers it with
// HTTP 409 Conflict, so a client can tell "busy" from "invalid".
type BusyError struct {
	Agent  string
	Holder Holder
}

func (e *BusyError) Error() string {
	h := e.Holder
	msg := fmt.Sprintf("agent %q already has an active run: Job %s/%s", e.Agent, h.Namespace, h.Name)
	if h.RunID != "" {
		msg += fmt.Sprintf(" (run %s)", h.RunID)
	}
	if !h.Since.IsZero() {
		msg += ", started " + h.Since.UTC().Format(time.RFC3339)
	}
	if h.Pending {
		msg += ", admitted but not yet stored (or deleted moments ago)"
	}
	if h.Terminating > 0 {
		msg += fmt.Sprintf(", ended but %d pod(s) still terminating", h.Terminating)
	}
	return msg + "; a new run is admitted once it completes, fails or is deleted"
}

// Holder is the Job a claim names.
type Holder struct {
	Namespace, Name, UID, RunID, Agent string
	Since                              time.Time
	// written is when the API server last wrote the claim.
	written time.Time
	// Pending: admitted, not (yet) found in the API.
	Pending bool
	// Terminating counts pods of an ended Job that have not finished.
	Terminating int
}

// Key is where an agent's claim lives.
type Key struct{ Namespace, Name, Agent string }

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// KeyFor returns the claim of the Job's agent under cfg. The name is
// readable and safe for any label value: a slug of the agent id and a hash
// of the scope and id, so distinct ids never share a claim.
func KeyFor(job *batchv1.Job, cfg config.Concurrency) Key {
	agent := job.Labels[contract.LabelAgentID]
	ns := job.Namespace
	scope := "ns/" + ns
	if cfg.Scope == config.ScopeCluster {
		ns, scope = cfg.ClaimNamespace, "cluster"
	}
	sum := sha256.Sum256([]byte(scope + "\x00" + agent))
	slug := strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(agent), "-"), "-")
	if len(slug) > 38 { // the name stays a 63-character DNS label
		slug = strings.TrimRight(slug[:38], "-")
	}
	return Key{Namespace: ns, Name: "clipjob-agent-" + slug + "-" + hex.EncodeToString(sum[:5]), Agent: agent}
}

func (c *Lock) now() time.Time {
	if c.Clock == nil {
		return time.Now()
	}
	return c.Clock.Now()
}

// Acquire claims the Job's agent for it, or returns a *BusyError naming
// the active run. A dry run decides the same way and writes nothing. The
// Job must carry its UID (validating admission sees it).
func (c *Lock) Acquire(ctx context.Context, job *batchv1.Job, cfg config.Concurrency, dryRun bool) error {
	key := KeyFor(job, cfg)
	attempts := c.MaxAttempts
	if attempts <= 0 {
		attempts = 8
	}
	grace := time.Duration(cfg.PendingGraceSeconds) * time.Second
	if err := c.checkUnclaimed(ctx, key, job, cfg); err != nil {
		return err
	}
	for i := 0; i < attempts; i++ {
		if i > 0 && c.OnRetry != nil {
			c.OnRetry()
		}
		// Create first: an idle agent has no claim (the claim controller deletes
		// them), so this is one round trip in the common case.
		_, err := c.Leases.Create(ctx, c.newLease(key, job), dryRun)
		if err == nil || !apierrors.IsAlreadyExists(err) {
			return claimErr(key, err)
		}
		lease, err := c.Leases.Get(ctx, key.Namespace, key.Name)
		if apierrors.IsNotFound(err) {
			continue // released meanwhile: create again
		}
		if err != nil {
			return claimErr(key, err)
		}
		holder := HolderOf(lease)
		if holder.UID != "" && holder.UID == string(job.UID) {
			return nil // this Job holds it already
		}
		free, holder, err := c.free(ctx, lease, grace)
		if err != nil {
			return claimErr(key, err)
		}
		if !free {
			return &BusyError{Agent: key.Agent, Holder: holder}
		}
		next := c.newLease(key, job)
		next.ResourceVersion = lease.ResourceVersion
		next.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
		_, err = c.Leases.Update(ctx, next, dryRun)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // taken over or released meanwhile: decide again
		}
		return claimErr(key, err)
	}
	return fmt.Errorf("claim %s/%s for agent %q: still contended after %d attempts; retry", key.Namespace, key.Name, key.Agent, attempts)
}

// checkUnclaimed refuses while another run of the agent is going, claim or
// not.
func (c *Lock) checkUnclaimed(ctx context.Context, key Key, job *batchv1.Job, cfg config.Concurrency) error {
	if c.Active == nil {
		return nil
	}
	jobs, err := c.Active(ctx, key, cfg)
	if err != nil {
		return claimErr(key, err)
	}
	for i := range jobs {
		j := &jobs[i]
		if j.UID == job.UID || !Running(j) {
			continue
		}
		h := Holder{Namespace: j.Namespace, Name: j.Name, UID: string(j.UID), RunID: j.Labels[contract.LabelRunID],
			Agent: key.Agent}
		if j.Status.StartTime != nil {
			h.Since = j.Status.StartTime.Time
		}
		return &BusyError{Agent: key.Agent, Holder: h}
	}
	return nil
}

// Running reports whether a Job is a run going on now: started (not
// suspended), not finished, not being deleted.
func Running(job *batchv1.Job) bool {
	return (job.Spec.Suspend == nil || !*job.Spec.Suspend) && !Finished(job) && job.DeletionTimestamp == nil
}

func claimErr(key Key, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("claim %s/%s for agent %q: %w", key.Namespace, key.Name, key.Agent, err)
}

func (c *Lock) newLease(key Key, job *batchv1.Job) *coordinationv1.Lease {
	now := metav1.NewMicroTime(c.now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: key.Name, Namespace: key.Namespace,
			Labels: map[string]string{Label: KindAgentRun, "app.kubernetes.io/managed-by": "clipjob"},
			Annotations: map[string]string{
				AnnotationJobUID: string(job.UID),
				AnnotationRunID:  job.Labels[contract.LabelRunID],
				AnnotationAgent:  key.Agent,
			},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(job.Namespace + "/" + job.Name),
			AcquireTime:    &now,
			RenewTime:      &now,
		},
	}
}

// HolderOf reads the Job a claim names.
func HolderOf(l *coordinationv1.Lease) Holder {
	h := Holder{UID: l.Annotations[AnnotationJobUID], RunID: l.Annotations[AnnotationRunID], Agent: l.Annotations[AnnotationAgent]}
	h.Namespace, h.Name, _ = strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "/")
	if l.Spec.AcquireTime != nil {
		h.Since = l.Spec.AcquireTime.Time
	}
	h.written = writtenAt(l)
	return h
}

// writtenAt is when the API server last wrote the Lease, by its own clock
// (managedFields record it on every write); zero if it does not say.
func writtenAt(l *coordinationv1.Lease) time.Time {
	var t time.Time
	for _, f := range l.ManagedFields {
		if f.Time != nil && f.Time.After(t) {
			t = f.Time.Time
		}
	}
	return t
}

// age is how long ago the claim was taken: by the API server's clock when
// the Lease says, so replicas' clocks are never compared with each other
// (only this replica's with the API server's); else by its AcquireTime.
func (h *Holder) age(now time.Time) time.Duration {
	if !h.written.IsZero() {
		return now.Sub(h.written)
	}
	return now.Sub(h.Since)
}

// free decides whether a claim's holder still runs: it is free when the
// Job finished (Complete or Failed), is being deleted with no pod left,
// was replaced by another Job of the same name, or never appeared within
// the grace window. The window must outlast the slowest admission (every
// validating webhook answers before the Job is stored); the clocks of the
// replicas compared across it are assumed to agree within seconds.
func (c *Lock) free(ctx context.Context, lease *coordinationv1.Lease, grace time.Duration) (bool, Holder, error) {
	h := HolderOf(lease)
	if h.Name == "" || h.UID == "" {
		return true, h, nil // not a claim clipjob wrote: every claim names its Job's UID
	}
	ended, err := c.ended(ctx, &h, grace)
	if err != nil || !ended {
		return false, h, err
	}
	// The run is over as far as the Job goes; its pods may not be.
	if c.Pods != nil && h.UID != "" {
		n, err := c.Pods.Running(ctx, h.Namespace, h.UID)
		if err != nil {
			return false, h, err
		}
		h.Terminating = n
		return n == 0, h, nil
	}
	return true, h, nil
}

// ended decides from the holder Job alone: completed or failed, being
// deleted with no pod left, replaced by another Job of the same name,
// never started (suspended) or never stored within the grace window.
func (c *Lock) ended(ctx context.Context, h *Holder, grace time.Duration) (bool, error) {
	job, err := c.Jobs.Get(ctx, h.Namespace, h.Name)
	switch {
	case apierrors.IsNotFound(err):
		h.Pending = true
		return h.age(c.now()) > grace, nil
	case err != nil:
		return false, err
	}
	if job.UID != "" && h.UID != "" && string(job.UID) != h.UID {
		return true, nil
	}
	// A Lease naming a Job that is not a run of its agent was not written
	// by Acquire (a squatter, or a copy): it holds nothing.
	if job.Labels[contract.LabelAgentID] != h.Agent {
		return true, nil
	}
	if Finished(job) || Deleted(job) {
		return true, nil
	}
	// A holder still suspended after the grace window was never started
	// (Queue mode: claimed, then its unsuspend failed): it runs nothing.
	if contract.Suspended(job) && job.Status.Active == 0 && h.age(c.now()) > grace {
		return true, nil
	}
	if job.Status.StartTime != nil {
		h.Since = job.Status.StartTime.Time
	}
	return false, nil
}

// Finished reports whether a Job has completed or failed.
func Finished(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// Deleted reports whether a Job is being deleted and has no active pod
// left (with orphan or foreground deletion its pods can outlive the mark).
func Deleted(job *batchv1.Job) bool {
	return job.DeletionTimestamp != nil && job.Status.Active == 0 && ptr.Deref(job.Status.Terminating, 0) == 0
}

// IsBusy reports whether err says the agent has an active run.
func IsBusy(err error) bool {
	var b *BusyError
	return errors.As(err, &b)
}
