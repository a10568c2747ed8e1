package app

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/charts"
)

// installedValues are the values doctor renders the chart with when no
// --values file is given: what the cluster says the release was installed
// with, so what it checks is what the install has (a release on
// PostgreSQL has the relay's Secret and replicas, one on bbolt its
// PersistentVolumeClaim). It also
// says where they came from:
//
//   - Helm's record of the release (the Secret `helm install` and `helm
//     upgrade` write): the values of its deployed revision;
//   - without one (the chart rendered with `helm template` and applied,
//     as GitOps tools do): the chart's defaults, with the store the
//     release's relay Deployment runs on — on PostgreSQL, its replicas,
//     Secret and schema — and the config and agent namespaces of the
//     release's config ConfigMap (the pod webhook's matchConditions list
//     the namespaces agents run in, the Roles are made in each).
func installedValues(ctx context.Context, cs kubernetes.Interface, rel charts.Release) (map[string]any, string) {
	values, revision, err := helmRecord(ctx, cs, rel)
	if err == nil && revision > 0 {
		return values, fmt.Sprintf("with the values of Helm's record of release %s (revision %d)", rel.Name, revision)
	}
	why := "no Helm record of release " + rel.Name
	if err != nil {
		why = "Helm's record of release " + rel.Name + " unreadable: " + err.Error()
	}
	values, store := relayStoreValues(ctx, cs, rel)
	values, config := configValues(ctx, cs, rel, values)
	return values, "with the chart's defaults, " + store + " and " + config + " (" + why + ")"
}

// helmRecord reads the values of the release's deployed revision from
// Helm's storage (the Secret driver, Helm's default): the Secrets labeled
// owner=helm, name=<release>, status=deployed, each holding the release as
// base64 of gzipped JSON. Revision 0: no record.
func helmRecord(ctx context.Context, cs kubernetes.Interface, rel charts.Release) (map[string]any, int, error) {
	secrets, err := cs.CoreV1().Secrets(rel.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "owner=helm,name=" + rel.Name + ",status=deployed"})
	if err != nil {
		return nil, 0, err
	}
	var values map[string]any
	revision := 0
	for _, s := range secrets.Items {
		v, _ := strconv.Atoi(s.Labels["version"])
		if v <= revision {
			continue
		}
		var record struct {
			Config map[string]any `json:"config"`
		}
		if err := decodeHelmRelease(s.Data["release"], &record); err != nil {
			return nil, 0, fmt.Errorf("Secret %s: %w", s.Name, err)
		}
		values, revision = record.Config, v
	}
	return values, revision, nil
}

// decodeHelmRelease undoes Helm's encoding of a release in its storage:
// JSON, gzipped, then base64.
func decodeHelmRelease(data []byte, out any) error {
	b, err := base64.StdEncoding.DecodeString(string(data))
	if err != nil {
		return err
	}
	if bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return err
		}
		defer gz.Close()
		if b, err = io.ReadAll(gz); err != nil {
			return err
		}
	}
	return json.Unmarshal(b, out)
}

// relayStoreValues are the chart's defaults with the store of the
// release's relay Deployment as the cluster has it, and what that is.
func relayStoreValues(ctx context.Context, cs kubernetes.Interface, rel charts.Release) (map[string]any, string) {
	rendered, err := charts.Render(rel, nil)
	if err != nil {
		return nil, "no relay store (the chart does not render: " + err.Error() + ")"
	}
	name := ""
	for _, o := range rendered.Objects {
		if o.GetKind() == "Deployment" && o.GetLabels()["app.kubernetes.io/component"] == "relay" {
			name = o.GetName()
		}
	}
	if name == "" {
		return nil, "no relay"
	}
	d, err := cs.AppsV1().Deployments(rel.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Sprintf("the relay's store unknown (Deployment %s: %v)", name, err)
	}
	pg := postgresRelay(d)
	if pg == nil {
		return nil, "the store of the relay Deployment " + name + ", bbolt"
	}
	postgres := pg["postgres"].(map[string]any)
	return map[string]any{"relay": pg}, fmt.Sprintf("the store of the relay Deployment %s, PostgreSQL (%v replicas, Secret %s, schema %s)",
		name, pg["replicas"], postgres["existingSecret"], postgres["schema"])
}

// postgresRelay is the relay values a Deployment the chart rendered on
// PostgreSQL shows (its replicas, the Secret and key of its connection
// string, its schema); nil for a relay on bbolt.
func postgresRelay(d *appsv1.Deployment) map[string]any {
	var args []string
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "relay" {
			args = c.Args
		}
	}
	postgres := map[string]any{}
	onPostgres := false
	for _, a := range args {
		switch {
		case a == "--store=postgres":
			onPostgres = true
		case strings.HasPrefix(a, "--postgres-schema="):
			postgres["schema"] = strings.TrimPrefix(a, "--postgres-schema=")
		}
	}
	if !onPostgres {
		return nil
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "postgres" && v.Secret != nil {
			postgres["existingSecret"] = v.Secret.SecretName
			if len(v.Secret.Items) > 0 {
				postgres["urlKey"] = v.Secret.Items[0].Key
			}
		}
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	return map[string]any{"store": "postgres", "replicas": int64(replicas), "postgres": postgres}
}

// configValues adds to values the config the release's config ConfigMap
// holds (its config.yaml, less apiVersion and kind: the chart writes
// values' config there) and the agent namespaces it names, and says what
// it found. The chart writes policy.namespaces as agentNamespaces followed
// by the tenant namespaces not among them; given back as agentNamespaces
// it renders the same Roles, the same namespace list in the pod webhook's
// matchConditions (tenants left out), and the same ConfigMap. A config
// whose policy.namespaces was set by hand says nothing of agentNamespaces:
// doctor then renders the default ones (give --values).
func configValues(ctx context.Context, cs kubernetes.Interface, rel charts.Release, values map[string]any) (map[string]any, string) {
	rendered, err := charts.Render(rel, values)
	if err != nil {
		return values, "no config (the chart does not render: " + err.Error() + ")"
	}
	name := ""
	for _, o := range rendered.Objects {
		if o.GetKind() == "ConfigMap" && o.GetNamespace() == rel.Namespace && strings.HasSuffix(o.GetName(), "-config") {
			name = o.GetName()
		}
	}
	if name == "" {
		return values, "no config ConfigMap"
	}
	cm, err := cs.CoreV1().ConfigMaps(rel.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return values, fmt.Sprintf("the default config (ConfigMap %s: %v)", name, err)
	}
	var config map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &config); err != nil || config == nil {
		return values, fmt.Sprintf("the default config (ConfigMap %s holds no config: %v)", name, err)
	}
	delete(config, "apiVersion")
	delete(config, "kind")
	out := map[string]any{}
	for k, v := range values {
		out[k] = v
	}
	out["config"] = config
	policy, _ := config["policy"].(map[string]any)
	namespaces, _ := policy["namespaces"].([]any)
	if len(namespaces) == 0 {
		return out, "the config of ConfigMap " + name
	}
	out["agentNamespaces"] = namespaces
	var names []string
	for _, n := range namespaces {
		names = append(names, fmt.Sprint(n))
	}
	return out, fmt.Sprintf("the config of ConfigMap %s (agent namespaces %s)", name, strings.Join(names, ", "))
}
