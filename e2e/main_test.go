package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// env is the installation every test runs against.
var env envT

type envT struct {
	cluster *cluster.Cluster
	cs      kubernetes.Interface
	webhook *harness.Webhook
	// webhookAddr is where the webhooks are normally registered.
	webhookAddr string
	webhookBin  string
	// extra replicas started by tests
	extra []*harness.Webhook
}

// configNow is the configuration the webhooks run with.
func (e *envT) configNow() *config.Config {
	cfg, err := config.Load(e.webhook.ConfigFile)
	if err != nil {
		panic(err)
	}
	return cfg
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	fmt.Fprintln(os.Stderr, "e2e: starting a local control plane (the first run builds Kubernetes from the Go module proxy: several minutes)")
	c, err := cluster.Start(ctx, cluster.Options{RealNode: cluster.WantRealNode()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: cluster:", err)
		return 1
	}
	defer func() {
		c.KeepDir = code != 0 // a failed run keeps its logs
		c.Stop()
	}()
	env.cluster, env.cs = c, c.Clientset()
	wh, bin, err := harness.InstallCluster(ctx, c, "webhook-0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer wh.Stop()
	env.webhook, env.webhookAddr, env.webhookBin = wh, wh.Addr, bin
	code = m.Run()
	closePaperclip(code != 0)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "e2e: failed; webhook log %s, cluster logs %s\n", wh.Log, c.Dir+"/logs")
		if os.Getenv("CI") != "" {
			dumpLog(wh.Log)
		}
	}
	return code
}

func dumpLog(path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if len(data) > 20000 {
		data = data[len(data)-20000:]
	}
	fmt.Fprintf(os.Stderr, "---- %s (tail) ----\n%s\n", path, data)
}
