package charts

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/paperclipai/clipjob/relay/replicas"
)

// relayStores are the relay's installs on PostgreSQL the chart promises.
var relayStores = map[string]map[string]any{
	"relay on postgres, secret from a value": {"relay": map[string]any{"store": "postgres", "replicas": 3,
		"postgres": map[string]any{"url": "postgres://relay:pw@db:5432/paperclip?sslmode=require"}}},
	"relay on postgres, existing secret": {"relay": map[string]any{"store": "postgres", "replicas": 2,
		"postgres": map[string]any{"existingSecret": "paperclip-db", "urlKey": "relay-url", "schema": "relay"}}},
}

// TestRelayOnPostgres: with store postgres the relay runs the replicas
// asked for, rolling one at a time, with no PVC; its connection string is
// a Secret's key mounted as the URL file (the chart's own Secret made from
// the value, or the operator's), and it may manage Leases in the release's
// namespace, where the replicas divide the runs.
func TestRelayOnPostgres(t *testing.T) {
	lintChart := chartLinter(t)
	for name, values := range relayStores {
		t.Run(name, func(t *testing.T) {
			lintChart(t, name, values)
			relay := values["relay"].(map[string]any)
			pg := relay["postgres"].(map[string]any)
			r := render(t, values)
			if r.Find("PersistentVolumeClaim", "clipjob-relay") != nil {
				t.Error("a PVC for the bbolt store, with the store on PostgreSQL")
			}
			var d appsv1.Deployment
			into(t, r, "Deployment", "clipjob-relay", &d)
			if want := int32(relay["replicas"].(int)); *d.Spec.Replicas != want || d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
				t.Errorf("%d replicas, strategy %s; want %d rolling", *d.Spec.Replicas, d.Spec.Strategy.Type, want)
			}
			key, _ := pg["urlKey"].(string)
			if key == "" {
				key = "url"
			}
			schema, _ := pg["schema"].(string)
			if schema == "" {
				schema = "clipjob_relay"
			}
			c := d.Spec.Template.Spec.Containers[0]
			for _, want := range []string{"--store=postgres", "--postgres-url-file=/etc/clipjob-relay/postgres/" + key,
				"--postgres-schema=" + schema, "--lease-namespace=clipjob-system", "--lease-group=clipjob-relay"} {
				if !slices.Contains(c.Args, want) {
					t.Errorf("relay args %v lack %s", c.Args, want)
				}
			}
			secret := "clipjob-relay-postgres"
			if s, _ := pg["existingSecret"].(string); s != "" {
				secret = s
				if r.Find("Secret", "clipjob-relay-postgres") != nil {
					t.Error("the chart made a Secret beside the existing one")
				}
			} else {
				var s corev1.Secret
				into(t, r, "Secret", secret, &s)
				if s.StringData[key] != pg["url"] {
					t.Errorf("Secret %s holds %v, want the connection string under %q", secret, s.StringData, key)
				}
			}
			mounted := false
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Secret != nil && v.Secret.SecretName == secret && len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == key {
					for _, m := range c.VolumeMounts {
						mounted = mounted || (m.Name == v.Name && m.MountPath == "/etc/clipjob-relay/postgres")
					}
				}
			}
			if !mounted {
				t.Errorf("the Secret %s's key %s is not mounted at /etc/clipjob-relay/postgres", secret, key)
			}
			var role rbacv1.Role
			into(t, r, "Role", "clipjob-relay-leases", &role)
			if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"leases"}) ||
				!slices.Equal(role.Rules[0].Verbs, []string{"get", "list", "create", "update", "delete"}) || role.Namespace != "clipjob-system" {
				t.Errorf("the relay's Lease Role: %+v", role)
			}
			var pdb policyv1.PodDisruptionBudget
			into(t, r, "PodDisruptionBudget", "clipjob-relay", &pdb)
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 ||
				pdb.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "relay" {
				t.Errorf("the relay's PodDisruptionBudget: %+v", pdb.Spec)
			}
			var rb rbacv1.RoleBinding
			into(t, r, "RoleBinding", "clipjob-relay-leases", &rb)
			if rb.RoleRef.Name != "clipjob-relay-leases" || len(rb.Subjects) != 1 || rb.Subjects[0].Name != "clipjob-relay" {
				t.Errorf("the relay's Lease RoleBinding: %+v", rb)
			}
		})
	}
}

// TestRelayOnBoltIsOneReplica: the default stays one replica on its PVC,
// with no Lease rights, and more than one replica of it is refused, as is
// PostgreSQL with no connection string, each naming the value to set.
func TestRelayOnBoltIsOneReplica(t *testing.T) {
	r := render(t, nil)
	var d appsv1.Deployment
	into(t, r, "Deployment", "clipjob-relay", &d)
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--store") || strings.HasPrefix(a, "--lease") {
			t.Errorf("bbolt: the relay is given %s", a)
		}
	}
	if r.Find("Role", "clipjob-relay-leases") != nil || r.Find("Secret", "clipjob-relay-postgres") != nil || r.Find("PodDisruptionBudget", "clipjob-relay") != nil {
		t.Error("bbolt: the relay gets Lease rights, a PostgreSQL Secret or a disruption budget")
	}
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"relay": map[string]any{"replicas": 2}}, "relay.replicas=2 needs relay.store=postgres"},
		{map[string]any{"relay": map[string]any{"store": "bolt", "replicas": 3}}, "relay.replicas=3 needs relay.store=postgres"},
		{map[string]any{"relay": map[string]any{"store": "postgres"}}, "relay.store=postgres needs the connection string"},
		{map[string]any{"relay": map[string]any{"store": "mysql"}}, "store"},
		{map[string]any{"relay": map[string]any{"replicas": 0}}, "replicas"},
	} {
		if _, err := Render(rel, tc.values); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want an error naming %q, got %v", tc.values, tc.want, err)
		}
	}
	// A release name with '.' makes a relay group no relay accepts on
	// PostgreSQL (a Lease is named <group>.<replica id>): refused at
	// install, not by relays failing to start.
	dotted := Release{Name: "team.clipjob", Namespace: rel.Namespace}
	if _, err := Render(dotted, relayStores["relay on postgres, existing secret"]); err == nil || !strings.Contains(err.Error(), "team.clipjob-relay") || !strings.Contains(err.Error(), "DNS label") {
		t.Errorf("a dotted release on PostgreSQL: %v, want a refusal naming the relay's name", err)
	}
	if _, err := Render(dotted, nil); err != nil {
		t.Errorf("a dotted release on bbolt (no Lease group): %v", err)
	}
}

// TestRelaySaysWhyItStopped: on either store, a relay that exits (a store
// it cannot open) leaves the end of its log as the container's termination
// message, so the pod's status says why it restarts.
func TestRelaySaysWhyItStopped(t *testing.T) {
	sets := map[string]map[string]any{"bbolt": nil}
	for name, values := range relayStores {
		sets[name] = values
	}
	for name, values := range sets {
		var d appsv1.Deployment
		into(t, render(t, values), "Deployment", "clipjob-relay", &d)
		if p := d.Spec.Template.Spec.Containers[0].TerminationMessagePolicy; p != corev1.TerminationMessageFallbackToLogsOnError {
			t.Errorf("%s: the relay's terminationMessagePolicy is %q, want %s", name, p, corev1.TerminationMessageFallbackToLogsOnError)
		}
	}
}

// TestRelayLeasePolicyNamesTheRelayAndItsGroup: wherever the relay gets
// its Lease Role (PostgreSQL), an admission policy bound to the release
// namespace matches the requests of the relay's ServiceAccount and holds
// them to Leases of the group its Deployment passes as --lease-group, for
// any release name; on bbolt, or with no relay, there is neither.
func TestRelayLeasePolicyNamesTheRelayAndItsGroup(t *testing.T) {
	for name, values := range relayStores {
		for _, release := range []Release{rel, {Name: "logs", Namespace: "paperclip-system"}} {
			r, err := Render(release, values)
			if err != nil {
				t.Fatal(err)
			}
			relayName := release.Name + "-clipjob-relay"
			if release == rel {
				relayName = "clipjob-relay"
			}
			var d appsv1.Deployment
			into(t, r, "Deployment", relayName, &d)
			group := ""
			for _, a := range d.Spec.Template.Spec.Containers[0].Args {
				if g, ok := strings.CutPrefix(a, "--lease-group="); ok {
					group = g
				}
			}
			var vap admissionregistrationv1.ValidatingAdmissionPolicy
			into(t, r, "ValidatingAdmissionPolicy", relayName+"-leases", &vap)
			sa := "'system:serviceaccount:" + release.Namespace + ":" + d.Spec.Template.Spec.ServiceAccountName + "'"
			if len(vap.Spec.MatchConditions) != 1 || !strings.HasSuffix(vap.Spec.MatchConditions[0].Expression, "== "+sa) {
				t.Errorf("%s, release %s: the policy's match conditions %+v do not name the relay's ServiceAccount %s", name, release.Name, vap.Spec.MatchConditions, sa)
			}
			rules := vap.Spec.MatchConstraints.ResourceRules
			if len(rules) != 1 || !slices.Equal(rules[0].Resources, []string{"leases"}) || len(rules[0].Operations) != 3 {
				t.Errorf("%s: the policy matches %+v, want the relay's Lease writes", name, rules)
			}
			vars := map[string]string{}
			for _, v := range vap.Spec.Variables {
				vars[v.Name] = v.Expression
			}
			if want := "'" + group + "'"; group == "" || vars["group"] != want || vars["label"] != "'"+replicas.LabelGroup+"'" {
				t.Errorf("%s, release %s: the policy's group %s and label %s, want %s (the relay's --lease-group) and '%s'", name, release.Name, vars["group"], vars["label"], want, replicas.LabelGroup)
			}
			if len(vap.Spec.Validations) != 2 || !strings.Contains(vap.Spec.Validations[0].Expression, "oldObject.metadata.name.startsWith(variables.group + '-')") ||
				!strings.Contains(vap.Spec.Validations[1].Expression, "(has(object.metadata.labels) && variables.label in object.metadata.labels") {
				t.Errorf("%s: the policy checks %+v, want the Lease as stored and as written", name, vap.Spec.Validations)
			}
			var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
			into(t, r, "ValidatingAdmissionPolicyBinding", relayName+"-leases", &binding)
			sel := binding.Spec.MatchResources.NamespaceSelector
			if binding.Spec.PolicyName != vap.Name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) ||
				sel == nil || len(sel.MatchExpressions) != 1 || !slices.Equal(sel.MatchExpressions[0].Values, []string{release.Namespace}) {
				t.Errorf("%s: the binding %+v, want Deny in the release namespace %s only", name, binding.Spec, release.Namespace)
			}
		}
	}
	for name, values := range map[string]map[string]any{"bbolt": nil, "no relay": {"relay": map[string]any{"enabled": false}}} {
		r := render(t, values)
		if r.Find("ValidatingAdmissionPolicy", "clipjob-relay-leases") != nil || r.Find("ValidatingAdmissionPolicyBinding", "clipjob-relay-leases") != nil {
			t.Errorf("%s: the relay Lease policy is rendered with no Lease Role to confine", name)
		}
	}
}
