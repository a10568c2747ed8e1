package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// The commands docs/paperclip.md gives an operator are the ones `make
// first-run` times, three at most, and each file they name exists.
func TestTheDocsGiveTheMeasuredCommands(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(harness.Root(), "docs", "paperclip.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## From helm install to a first run\n")
	if !ok {
		t.Fatal(`docs/paperclip.md has no section "From helm install to a first run"`)
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("the section has no sh block")
	}
	// A command may run on over several lines (a trailing backslash).
	var docs []string
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		if line = strings.Join(strings.Fields(line), " "); line != "" && !strings.HasPrefix(line, "#") {
			docs = append(docs, line)
		}
	}
	if d := cmp.Diff(FirstRunCommands, docs); d != "" {
		t.Errorf("the docs' commands are not the measured ones (-measured +docs):\n%s", d)
	}
	if len(FirstRunCommands) > 3 {
		t.Errorf("%d commands; the promise is 3 at most", len(FirstRunCommands))
	}
	for _, c := range FirstRunCommands {
		for _, f := range strings.Fields(c) {
			if strings.HasPrefix(f, "./") || strings.HasPrefix(f, "examples/") {
				if _, err := os.Stat(filepath.Join(harness.Root(), f)); err != nil {
					t.Errorf("%q names %s: %v", c, f, err)
				}
			}
		}
	}
}

// The Paperclip of examples/paperclip-in-cluster.yaml is the one the
// suite deploys and proves (DeployPaperclip, TestPaperclipInTheCluster),
// less only what the suite adds for its own cluster: the RBAC the
// adapter's README gives, the server's pod as paperclipPodSpec makes it,
// the image make paperclip-image tags.
func TestTheFirstRunManifestIsWhatTheSuiteDeploys(t *testing.T) {
	m, err := readFirstRunManifest()
	if err != nil {
		t.Fatal(err)
	}
	role, binding, err := harness.PaperclipServerRBAC()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(role.Rules, m.role.Rules); d != "" {
		t.Errorf("the Role is not the adapter's README's (-README +example):\n%s", d)
	}
	if m.role.Name != role.Name || m.binding.Name != binding.Name || m.binding.RoleRef != binding.RoleRef ||
		cmp.Diff(binding.Subjects, m.binding.Subjects) != "" {
		t.Errorf("the RoleBinding %+v is not the README's %+v", m.binding, binding)
	}
	const ns = "paperclip"
	for kind, got := range map[string]string{"ServiceAccount": m.serviceAccount.Namespace, "Role": m.role.Namespace,
		"RoleBinding": m.binding.Namespace, "claim": m.claim.Namespace, "Deployment": m.deployment.Namespace} {
		if got != ns {
			t.Errorf("the %s is in namespace %q; want %s, the chart's config.source.namespace", kind, got, ns)
		}
	}
	if m.binding.Subjects[0].Name != m.serviceAccount.Name || m.deployment.Spec.Template.Spec.ServiceAccountName != m.serviceAccount.Name {
		t.Error("the Deployment does not run as the ServiceAccount the Role is bound to")
	}
	if len(m.claim.Spec.AccessModes) != 1 || m.claim.Spec.AccessModes[0] != corev1.ReadWriteMany {
		t.Errorf("the home's claim is %v; agent pods on other nodes need ReadWriteMany", m.claim.Spec.AccessModes)
	}

	// The chart's defaults with the example's values: the source is this
	// Deployment, the CA is published as the ConfigMap it mounts.
	valuesData, err := os.ReadFile(filepath.Join(harness.Root(), "examples", "paperclip-in-cluster-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(valuesData, &values); err != nil {
		t.Fatal(err)
	}
	r, err := charts.Render(charts.Release{Name: "clipjob", Namespace: "clipjob-system"}, values)
	if err != nil {
		t.Fatalf("the example's values do not render: %v", err)
	}
	if m.namespace.Name != ns || m.namespace.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("the manifest's namespace %+v; want %s, enforcing Pod Security restricted", m.namespace.ObjectMeta, ns)
	}
	if r.Find("Namespace", ns) != nil {
		t.Errorf("the chart makes namespace %s too; helm refuses a namespace the manifest made", ns)
	}
	var webhook appsv1.Deployment
	if err := r.Into("Deployment", "clipjob-webhook", &webhook); err != nil {
		t.Fatal(err)
	}
	published := false
	for _, a := range webhook.Spec.Template.Spec.Containers[0].Args {
		published = published || a == "--publish-ca-configmap="+ns+"/clipjob-ca"
	}
	if !published {
		t.Error("the chart does not publish its CA bundle as the ConfigMap clipjob-ca the example mounts")
	}
	var cm corev1.ConfigMap
	if err := r.Into("ConfigMap", "clipjob-config", &cm); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"namespace: " + ns, "deployment: " + m.deployment.Name, "container: " + m.deployment.Spec.Template.Spec.Containers[0].Name} {
		if !strings.Contains(cm.Data["config.yaml"], want) {
			t.Errorf("the chart's source is not the example's Deployment: no %q in\n%s", want, cm.Data["config.yaml"])
		}
	}

	// The pod: the suite's, but for its placement on the real node and
	// the JWT secret (callback tokens; a local_trusted first run has no
	// agent that calls back).
	version, err := harness.PaperclipVersion()
	if err != nil {
		t.Fatal(err)
	}
	want := harness.PaperclipPodSpec("docker.io/local/paperclip-clipjob:"+version, m.serviceAccount.Name, m.claim.Name, "https://clipjob-relay.clipjob-system.svc")
	want.NodeSelector, want.Tolerations = nil, nil
	c := &want.Containers[0]
	var env []corev1.EnvVar
	for _, e := range c.Env {
		if e.Name != "PAPERCLIP_AGENT_JWT_SECRET" {
			env = append(env, e)
		}
	}
	c.Env = env
	got := m.deployment.Spec.Template.Spec
	got.Containers[0].ImagePullPolicy = ""
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("the example's pod differs from the suite's (-suite +example):\n%s", d)
	}
	if m.deployment.Spec.Strategy.Type != "Recreate" || ptr.Deref(m.deployment.Spec.Replicas, 1) != 1 ||
		m.deployment.Spec.Template.Labels["app"] != "paperclip-server" {
		t.Errorf("the Deployment: %+v", m.deployment.Spec)
	}
}

// The clock stops at the agent's own first line, not at the notes
// Paperclip and the adapter put in the run's log before it (a measured
// run's first stdout record was Paperclip's "[paperclip] No project …").
func TestTheClockStopsAtTheAgentsLine(t *testing.T) {
	for line, want := range map[string]bool{
		`stdout: [paperclip] No project or prior session workspace was available.`:    false,
		`stderr: [clipjob] created Job paperclip/pc-1 (clipjob profile claude_local)`: false,
		`stdout: [clipjob] following run r1 through the relay`:                        false,
		`stderr: an agent's warning`:                                                  false,
		`stdout: {"model":"fake-model","subtype":"init","type":"system"}`:             true,
		`waiting for Paperclip at http://127.0.0.1:3100`:                              false,
	} {
		if got := agentLine(line); got != want {
			t.Errorf("agentLine(%q) = %v, want %v", line, got, want)
		}
	}
}
