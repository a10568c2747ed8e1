package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// CertManager is cert-manager's controller and cainjector running against
// the local control plane, built from the Go module proxy by
// hack/cert-manager/build.sh (the version its go.mod pins).
type CertManager struct {
	Controller, CAInjector *Process
}

// Stop ends both.
func (m *CertManager) Stop() {
	m.CAInjector.Stop()
	m.Controller.Stop()
}

// StartCertManager builds cert-manager (first time only), creates its
// CRDs and runs its controller and cainjector with the admin kubeconfig.
func StartCertManager(ctx context.Context, c *cluster.Cluster) (*CertManager, error) {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(Root(), "hack", "cert-manager", "build.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("building cert-manager (hack/cert-manager/build.sh): %w", err)
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "cert-manager")
	crds, err := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "..", "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		return nil, fmt.Errorf("cert-manager's CRDs beside %s: %v", bin, err)
	}
	if err := createCRDs(ctx, c, crds); err != nil {
		return nil, err
	}
	m := &CertManager{}
	if m.Controller, err = StartProcess(ctx, filepath.Join(c.Dir, "cert-manager-controller.log"), "", bin,
		"controller", "--kubeconfig", c.Kubeconfig, "--cluster-resource-namespace", "kube-system"); err != nil {
		return nil, err
	}
	if m.CAInjector, err = StartProcess(ctx, filepath.Join(c.Dir, "cert-manager-cainjector.log"), "", bin,
		"cainjector", "--kubeconfig", c.Kubeconfig); err != nil {
		m.Controller.Stop()
		return nil, err
	}
	return m, nil
}

// createCRDs reads each file's CRD and has the cluster create it.
func createCRDs(ctx context.Context, c *cluster.Cluster, files []string) error {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		crds = append(crds, crd)
	}
	return c.CreateCRDs(ctx, crds...)
}
