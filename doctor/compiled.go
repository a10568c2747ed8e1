package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/compile"
	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/templates"
)

// compiledOn reports whether the release runs the compiled policies'
// syncer (chart value compiledPolicies.enabled): its webhook Deployment
// passes --compiled-policies.
func (d *doctor) compiledOn() bool {
	for _, o := range d.rendered.Objects {
		if o.GetKind() != "Deployment" {
			continue
		}
		var dep appsv1.Deployment
		if err := d.rendered.Into("Deployment", o.GetName(), &dep); err != nil {
			continue
		}
		for _, c := range dep.Spec.Template.Spec.Containers {
			if slices.Contains(c.Args, "--compiled-policies") {
				return true
			}
		}
	}
	return false
}

// compiledPolicies checks, when the release keeps compiled policies, that
// each one the source and config compile to is in the cluster as compiled
// and bound; and, when it does not, that its namespace's is not left (a
// policy left behind keeps completing Jobs the config no longer wants
// completed so; the validating webhook then refuses them).
func (d *doctor) compiledPolicies(ctx context.Context, cfg *config.Config, inh *templates.Inherited) {
	ar := d.cs.AdmissionregistrationV1()
	on := d.compiledOn()
	list, err := ar.MutatingAdmissionPolicies().List(ctx, metav1.ListOptions{LabelSelector: compile.ManagedByLabel + "=" + compile.ManagedBy})
	switch {
	case err != nil && on:
		d.add(fail("compiled-policies", "listing MutatingAdmissionPolicies: "+err.Error(), "give your user list on mutatingadmissionpolicies (Kubernetes 1.36 or later)"))
		return
	case err != nil:
		return // off, and not ours to ask of an older cluster or a narrower user
	}
	if !on {
		// Only the policy of this release's namespace is its own: a
		// cluster may hold several releases (webhook.namespaces), and
		// another's policies complete that release's Jobs, not these.
		mine := compile.PolicyName(cfg.Source.Namespace)
		for _, p := range list.Items {
			if p.Name == mine {
				d.add(fail("compiled-policies", fmt.Sprintf("compiledPolicies is off, but clipjob's policy %s for namespace %s is in the cluster", mine, cfg.Source.Namespace),
					fmt.Sprintf("delete it: kubectl delete mutatingadmissionpolicybinding,mutatingadmissionpolicy %s", mine)))
			}
		}
		return
	}
	fix := "the elected webhook replica writes them within seconds: check its log for \"compiled admission policies\" and that it may write mutatingadmissionpolicies"
	if inh == nil {
		d.add(fail("compiled-policies", "no source to compile them from (see source-deployment)", "fix the source first"))
		return
	}
	want, err := compile.Mutating(compile.Input{Namespace: cfg.Source.Namespace, Inherited: inh, Config: cfg})
	if err != nil {
		d.add(fail("compiled-policies", err.Error(), "the mutating webhook completes agent Jobs alone meanwhile; report the config that the compiler cannot follow"))
		return
	}
	var bad []string
	for _, p := range want {
		got, err := ar.MutatingAdmissionPolicies().Get(ctx, p.Policy.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("%s: %v", p.Policy.Name, err))
			continue
		case !equality.Semantic.DeepEqual(got.Spec.Mutations, p.Policy.Spec.Mutations) || !equality.Semantic.DeepEqual(got.Spec.Variables, p.Policy.Spec.Variables) ||
			!equality.Semantic.DeepEqual(got.Spec.MatchConditions, p.Policy.Spec.MatchConditions) ||
			!equality.Semantic.DeepEqual(got.Spec.FailurePolicy, p.Policy.Spec.FailurePolicy) || got.Spec.ReinvocationPolicy != p.Policy.Spec.ReinvocationPolicy:
			bad = append(bad, fmt.Sprintf("%s is stale (compiled from %s, the source is now %s)", p.Policy.Name,
				got.Annotations["clipjob.paperclip.io/source"], p.Policy.Annotations["clipjob.paperclip.io/source"]))
			continue
		}
		if _, err := ar.MutatingAdmissionPolicyBindings().Get(ctx, p.Binding.Name, metav1.GetOptions{}); err != nil {
			bad = append(bad, fmt.Sprintf("binding %s: %v", p.Binding.Name, err))
		}
	}
	if len(bad) > 0 {
		d.add(fail("compiled-policies", strings.Join(bad, "; "), fix))
		return
	}
	d.add(pass("compiled-policies", fmt.Sprintf("%d policies for namespace %s, current with %s %s", len(want), cfg.Source.Namespace, inh.Source, inh.Revision)))
}
