package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/e2e/harness"
)

// firstRunManifest is examples/paperclip-in-cluster.yaml, decoded.
type firstRunManifest struct {
	namespace      corev1.Namespace
	serviceAccount corev1.ServiceAccount
	role           rbacv1.Role
	binding        rbacv1.RoleBinding
	claim          corev1.PersistentVolumeClaim
	deployment     appsv1.Deployment
}

func readFirstRunManifest() (*firstRunManifest, error) {
	path := filepath.Join(harness.Root(), "examples", "paperclip-in-cluster.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := &firstRunManifest{}
	seen := map[string]bool{}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var into any
		switch meta.Kind {
		case "Namespace":
			into = &m.namespace
		case "ServiceAccount":
			into = &m.serviceAccount
		case "Role":
			into = &m.role
		case "RoleBinding":
			into = &m.binding
		case "PersistentVolumeClaim":
			into = &m.claim
		case "Deployment":
			into = &m.deployment
		default:
			return nil, fmt.Errorf("%s: a %q; want the six objects of a first run", path, meta.Kind)
		}
		if seen[meta.Kind] {
			return nil, fmt.Errorf("%s: two of kind %s", path, meta.Kind)
		}
		seen[meta.Kind] = true
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			return nil, fmt.Errorf("%s: the %s: %w", path, meta.Kind, err)
		}
	}
	if len(seen) != 6 || len(m.deployment.Spec.Template.Spec.Containers) != 1 {
		return nil, fmt.Errorf("%s: want a Namespace, ServiceAccount, Role, RoleBinding, claim and a one-container Deployment", path)
	}
	return m, nil
}
