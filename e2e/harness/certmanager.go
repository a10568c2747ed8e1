package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
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

// createCRDs creates the CRDs of the files (leaving existing ones alone)
// and waits until each is served.
func createCRDs(ctx context.Context, c *cluster.Cluster, files []string) error {
	cs, err := apiextensionsclient.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}
