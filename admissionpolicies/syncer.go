package admissionpolicies

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1 "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/templates"
)

// Client is the part of the API the syncer writes: the typed
// admissionregistration/v1 client (kubernetes.Interface's
// AdmissionregistrationV1()) is one.
type Client interface {
	MutatingAdmissionPolicies() v1.MutatingAdmissionPolicyInterface
	MutatingAdmissionPolicyBindings() v1.MutatingAdmissionPolicyBindingInterface
}

// Source is what agent Jobs inherit under a config (the webhook's source
// cache): the same pointer while the source and the config are unchanged.
type Source interface {
	Inherited(ctx context.Context, cfg *config.Config) (*templates.Inherited, *templates.TemplateHashes, error)
}

// Configs gives the config in force.
type Configs interface{ Current() *config.Config }

// SpecHashAnnotation records the hash of the spec the syncer wrote, so an
// unchanged policy is not rewritten (the API server defaults fields, so
// the stored spec never equals the written one) and one changed by
// someone else is.
const SpecHashAnnotation = "clipjob.paperclip.io/spec-hash"

// OwnerLabel names the installation whose syncer wrote a policy (Syncer.
// Owner): a syncer deletes only its own, so two installations of clipjob
// in one cluster, each for its own namespaces, keep each other's.
const OwnerLabel = "clipjob.paperclip.io/owner"

// Syncer keeps the compiled policies of the source's namespace (package
// compile) in the cluster equal to what the source and the config in
// force compile to: it creates the missing, rewrites the changed, and
// deletes its own that are no longer wanted. With no source, or a render
// the compiler cannot follow, it deletes them all: agent Jobs then go to
// the mutating webhook alone, which answers for itself.
type Syncer struct {
	Client  Client
	Configs Configs
	Sources Source
	// Owner is the installation, written as OwnerLabel on what the
	// syncer writes (the webhook gives its release namespace); it deletes
	// only what carries its own. A policy written before owners is taken
	// over when it is wanted (rewritten with the label) and left alone
	// when not: a stale one completes Jobs the validating webhook refuses.
	Owner string
	// Interval is how often the syncer looks again (default 1s): the
	// policies' source revision is part of every Job they complete, and
	// the validating webhook refuses a Job completed by a stale one.
	Interval time.Duration
	Log      logr.Logger

	mu   sync.Mutex
	memo struct {
		inh     *templates.Inherited
		cfgHash string
		want    []compile.Policy
		err     error
	}
}

// NeedLeaderElection: one replica writes the policies.
func (s *Syncer) NeedLeaderElection() bool { return true }

// Start syncs every Interval until ctx ends.
func (s *Syncer) Start(ctx context.Context) error {
	interval := s.Interval
	if interval <= 0 {
		interval = time.Second
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var lastErr string
	for {
		err := s.Sync(ctx)
		switch {
		case err != nil && err.Error() != lastErr:
			s.Log.Error(err, "compiled admission policies")
		case err == nil && lastErr != "":
			s.Log.Info("compiled admission policies are current again")
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Sync makes the cluster's compiled policies what the source and config
// in force compile to, once.
func (s *Syncer) Sync(ctx context.Context) error {
	want, wantErr := s.wanted(ctx)
	keep := map[string]bool{}
	var errs []error
	for _, p := range want {
		keep[p.Policy.Name] = true
		if err := s.applyPolicy(ctx, p.Policy); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := s.applyBinding(ctx, p.Binding); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.deleteOthers(ctx, keep))
	return errors.Join(append([]error{wantErr}, errs...)...)
}

// wanted compiles the policies, once per source revision and config.
func (s *Syncer) wanted(ctx context.Context) ([]compile.Policy, error) {
	cfg := s.Configs.Current()
	inh, _, err := s.Sources.Inherited(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("no policies while the source is unavailable (the mutating webhook completes agent Jobs alone): %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.memo.inh != inh || s.memo.cfgHash != cfg.Hash() {
		want, err := compile.Mutating(compile.Input{Namespace: cfg.Source.Namespace, Inherited: inh, Config: cfg})
		if err != nil {
			err = fmt.Errorf("no policies (the mutating webhook completes agent Jobs alone): %w", err)
		}
		s.memo.inh, s.memo.cfgHash, s.memo.want, s.memo.err = inh, cfg.Hash(), want, err
		if err == nil {
			s.Log.Info("compiled admission policies", "namespace", cfg.Source.Namespace, "source", inh.Source+" "+inh.Revision, "policies", len(want))
		}
	}
	return s.memo.want, s.memo.err
}

func specHash(spec any) string {
	data, err := json.Marshal(spec)
	if err != nil {
		panic("hashing a policy spec: " + err.Error()) // plain API types; cannot fail
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// withHash is obj's metadata with the hash of spec recorded.
func withHash(meta metav1.ObjectMeta, spec any) metav1.ObjectMeta {
	meta = *meta.DeepCopy()
	if meta.Annotations == nil {
		meta.Annotations = map[string]string{}
	}
	meta.Annotations[SpecHashAnnotation] = specHash(spec)
	return meta
}

// current reports whether a stored object still holds what was written:
// the same hash, labels and annotations, and the fields the API server
// does not default as written.
func current(stored, want metav1.ObjectMeta, same bool) bool {
	return same && maps.Equal(stored.Labels, want.Labels) && maps.Equal(stored.Annotations, want.Annotations)
}

// owned is meta with the syncer's owner label.
func (s *Syncer) owned(meta metav1.ObjectMeta) metav1.ObjectMeta {
	if s.Owner == "" {
		return meta
	}
	meta = *meta.DeepCopy()
	if meta.Labels == nil {
		meta.Labels = map[string]string{}
	}
	meta.Labels[OwnerLabel] = s.Owner
	return meta
}

// mine reports whether a policy or binding clipjob wrote is this
// syncer's to delete: its owner's.
func (s *Syncer) mine(meta metav1.ObjectMeta) bool {
	return meta.Labels[OwnerLabel] == s.Owner
}

func (s *Syncer) applyPolicy(ctx context.Context, p *admissionregistrationv1.MutatingAdmissionPolicy) error {
	c := s.Client.MutatingAdmissionPolicies()
	want := p.DeepCopy()
	want.ObjectMeta = withHash(s.owned(p.ObjectMeta), p.Spec)
	stored, err := c.Get(ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Create(ctx, want, metav1.CreateOptions{})
		return s.wrote("created", "MutatingAdmissionPolicy", p.Name, err)
	case err != nil:
		return err
	}
	// What decides a Job's fate, compared as written (the API server
	// defaults none of it). The match constraints, which it defaults, are
	// not: an edit of them alone (by whoever may edit cluster policies)
	// stays until the next change of the compiled policy, whose hash
	// differs; doctor's compiled-policies check does not see it either.
	same := equality.Semantic.DeepEqual(stored.Spec.Mutations, want.Spec.Mutations) &&
		equality.Semantic.DeepEqual(stored.Spec.Variables, want.Spec.Variables) &&
		equality.Semantic.DeepEqual(stored.Spec.MatchConditions, want.Spec.MatchConditions) &&
		equality.Semantic.DeepEqual(stored.Spec.FailurePolicy, want.Spec.FailurePolicy) &&
		stored.Spec.ReinvocationPolicy == want.Spec.ReinvocationPolicy
	if current(stored.ObjectMeta, want.ObjectMeta, same) {
		return nil
	}
	want.ResourceVersion = stored.ResourceVersion
	_, err = c.Update(ctx, want, metav1.UpdateOptions{})
	return s.wrote("updated", "MutatingAdmissionPolicy", p.Name, err)
}

func (s *Syncer) applyBinding(ctx context.Context, b *admissionregistrationv1.MutatingAdmissionPolicyBinding) error {
	c := s.Client.MutatingAdmissionPolicyBindings()
	want := b.DeepCopy()
	want.ObjectMeta = withHash(s.owned(b.ObjectMeta), b.Spec)
	stored, err := c.Get(ctx, b.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Create(ctx, want, metav1.CreateOptions{})
		return s.wrote("created", "MutatingAdmissionPolicyBinding", b.Name, err)
	case err != nil:
		return err
	}
	same := stored.Spec.PolicyName == want.Spec.PolicyName && stored.Spec.MatchResources != nil &&
		equality.Semantic.DeepEqual(stored.Spec.MatchResources.NamespaceSelector, want.Spec.MatchResources.NamespaceSelector) &&
		stored.Spec.MatchResources.ObjectSelector.Size() == 0 && len(stored.Spec.MatchResources.ExcludeResourceRules) == 0
	if current(stored.ObjectMeta, want.ObjectMeta, same) {
		return nil
	}
	want.ResourceVersion = stored.ResourceVersion
	_, err = c.Update(ctx, want, metav1.UpdateOptions{})
	return s.wrote("updated", "MutatingAdmissionPolicyBinding", b.Name, err)
}

func (s *Syncer) wrote(what, kind, name string, err error) error {
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, name, err)
	}
	s.Log.Info(what, "kind", kind, "name", name)
	return nil
}

var managedBy = metav1.ListOptions{LabelSelector: compile.ManagedByLabel + "=" + compile.ManagedBy}

// deleteOthers deletes the syncer's own policies and bindings (by label,
// and its owner's) that are not in keep: a profile removed, another
// source namespace, or no policies at all.
func (s *Syncer) deleteOthers(ctx context.Context, keep map[string]bool) error {
	var errs []error
	bindings, err := s.Client.MutatingAdmissionPolicyBindings().List(ctx, managedBy)
	if err != nil {
		return err
	}
	for _, b := range bindings.Items {
		if !keep[b.Name] && s.mine(b.ObjectMeta) {
			errs = append(errs, s.deleted("MutatingAdmissionPolicyBinding", b.Name,
				s.Client.MutatingAdmissionPolicyBindings().Delete(ctx, b.Name, metav1.DeleteOptions{})))
		}
	}
	policies, err := s.Client.MutatingAdmissionPolicies().List(ctx, managedBy)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(policies.Items))
	for _, p := range policies.Items {
		if s.mine(p.ObjectMeta) {
			names = append(names, p.Name)
		}
	}
	for _, name := range slices.Sorted(slices.Values(names)) {
		if !keep[name] {
			errs = append(errs, s.deleted("MutatingAdmissionPolicy", name,
				s.Client.MutatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})))
		}
	}
	return errors.Join(errs...)
}

func (s *Syncer) deleted(kind, name string, err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return s.wrote("deleted", kind, name, err)
}
