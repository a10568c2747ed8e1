// Command controlplane starts the local control plane the integration
// tier runs on (package cluster: etcd, kube-apiserver, controller manager,
// scheduler, kwok) and keeps it running until interrupted, so tests can
// attach to it instead of starting one each time:
//
//	make controlplane                      # in one terminal
//	CLIPJOB_E2E_CONTROLPLANE=<dir> go test -run TestQueueMode ./e2e/integration/
//
// Each test installs clipjob for namespaces of its own, so runs after runs
// share it; the webhook is rebuilt from the checkout by every run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

func main() {
	dir := flag.String("dir", filepath.Join(os.TempDir(), "clipjob-controlplane"), "directory for the control plane's certificates, data and logs (emptied first)")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	c, err := cluster.Start(ctx, cluster.Options{Dir: dir})
	cancel()
	if err != nil {
		return err
	}
	defer c.Stop()
	fmt.Printf("\nThe control plane is up. In another shell:\n\n    export %s=%s\n    go test -run TestQueueMode ./e2e/integration/\n\nkubectl: KUBECONFIG=%s; logs in %s. Ctrl-C stops it.\n",
		cluster.AttachEnv, dir, c.Kubeconfig, filepath.Join(dir, "logs"))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	fmt.Println("controlplane: stopping")
	return nil
}
