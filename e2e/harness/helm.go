package harness

import (
	"fmt"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/paperclipai/clipjob/charts"
)

// Helm installs, upgrades and uninstalls the chart on c through Helm's own
// Go SDK: what `helm install` does, release records in Secrets included.
type Helm struct {
	cfg *action.Configuration
	rel charts.Release
}

// NewHelm returns Helm acting on release rel of the cluster kubeconfig
// reaches (the local control plane's admin, or a kind cluster's).
func NewHelm(kubeconfig string, rel charts.Release, logf func(string, ...any)) (*Helm, error) {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	flags.Namespace = &rel.Namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, rel.Namespace, "secret", logf); err != nil {
		return nil, fmt.Errorf("helm: %w", err)
	}
	return &Helm{cfg: cfg, rel: rel}, nil
}

// Install installs the chart with values, creating the namespace.
func (h *Helm) Install(values map[string]any) (*release.Release, error) {
	ch, err := charts.Load()
	if err != nil {
		return nil, err
	}
	in := action.NewInstall(h.cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = h.rel.Name, h.rel.Namespace, true
	return in.Run(ch, values)
}

// Upgrade upgrades the release to values (not reusing the old ones).
func (h *Helm) Upgrade(values map[string]any) (*release.Release, error) {
	ch, err := charts.Load()
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(h.cfg)
	up.Namespace = h.rel.Namespace
	return up.Run(h.rel.Name, ch, values)
}

// Uninstall deletes the release and what it created.
func (h *Helm) Uninstall() error {
	_, err := action.NewUninstall(h.cfg).Run(h.rel.Name)
	return err
}
