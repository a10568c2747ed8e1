package charts

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
// the value, or the operator's). The replicas divide the runs through the
// store alone: the relay's ServiceAccount may do nothing with Leases.
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
				"--postgres-schema=" + schema} {
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
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--lease-namespace") || strings.HasPrefix(a, "--lease-group") {
					t.Errorf("the relay is given %s: its replicas use no Lease", a)
				}
			}
			if rules := relayLeaseRules(t, r, d.Spec.Template.Spec.ServiceAccountName); len(rules) > 0 {
				t.Errorf("the relay's ServiceAccount may act on Leases: %+v", rules)
			}
			var pdb policyv1.PodDisruptionBudget
			into(t, r, "PodDisruptionBudget", "clipjob-relay", &pdb)
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 ||
				pdb.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "relay" {
				t.Errorf("the relay's PodDisruptionBudget: %+v", pdb.Spec)
			}
		})
	}
}

// relayLeaseRules are the rules on Leases (or on every resource) of the
// Roles and ClusterRoles bound to the ServiceAccount sa in r.
func relayLeaseRules(t *testing.T, r *Rendered, sa string) []rbacv1.PolicyRule {
	t.Helper()
	var out []rbacv1.PolicyRule
	for _, o := range r.Objects {
		if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.RoleBinding
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == sa }) {
			continue
		}
		role := r.Find(b.RoleRef.Kind, b.RoleRef.Name)
		if role == nil {
			continue
		}
		var rr rbacv1.ClusterRole
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(role.Object, &rr); err != nil {
			t.Fatal(err)
		}
		for _, rule := range rr.Rules {
			if slices.Contains(rule.Resources, "leases") || slices.Contains(rule.Resources, "*") {
				out = append(out, rule)
			}
		}
	}
	return out
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
	if rules := relayLeaseRules(t, r, d.Spec.Template.Spec.ServiceAccountName); len(rules) > 0 || r.Find("Secret", "clipjob-relay-postgres") != nil || r.Find("PodDisruptionBudget", "clipjob-relay") != nil {
		t.Errorf("bbolt: the relay gets Lease rights %+v, a PostgreSQL Secret or a disruption budget", rules)
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
	// A release name with '.' names no Lease any more: installed on
	// PostgreSQL as on bbolt.
	dotted := Release{Name: "team.clipjob", Namespace: rel.Namespace}
	for _, values := range []map[string]any{nil, relayStores["relay on postgres, existing secret"]} {
		if _, err := Render(dotted, values); err != nil {
			t.Errorf("a dotted release: %v", err)
		}
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
