package realnode

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"k8s.io/client-go/kubernetes"

	"github.com/paperclipai/clipjob/e2e/cluster"
	"github.com/paperclipai/clipjob/e2e/harness"
)

// suite is the control plane with the real node, and clipjob installed on
// it as an operator installs it (harness.InstallCluster).
var suite struct {
	cluster *cluster.Cluster
	cs      kubernetes.Interface
	in      *harness.Install
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	flag.Parse() // -run decides below whether the shared server starts early
	// The harness's controller-runtime clients log nothing worth reading.
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	fmt.Fprintln(os.Stderr, "realnode: starting a local control plane with a real node (the first run builds Kubernetes from the Go module proxy: several minutes)")
	c, err := cluster.Start(ctx, cluster.Options{RealNode: cluster.WantRealNode()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "realnode: cluster:", err)
		return 1
	}
	defer func() {
		c.KeepDir = code != 0 // a failed run keeps its logs
		c.Stop()
	}()
	suite.cluster, suite.cs = c, c.Clientset()
	in, err := harness.InstallCluster(ctx, c, "webhook-0", harness.RealNodeProfiles())
	if err != nil {
		fmt.Fprintln(os.Stderr, "realnode:", err)
		return 1
	}
	defer in.Webhook.Stop()
	suite.in = in
	// The shared Paperclip server takes about a minute to start; the
	// serial test (egress) runs first, so it starts
	// beside it rather than after it, and so do the servers of the
	// tests that take one of their own, and the Paperclip image
	// TestPaperclipInTheCluster runs is loaded into the node. A run of
	// chosen tests (-run) starts them only if one of them asks.
	spares := make(chan struct{})
	if suite.cluster.HasRealNode() && flag.Lookup("test.run").Value.String() == "" {
		go startSharedPaperclip()
		go func() { _, _ = harness.LoadPaperclipImage(ctx, c) }() // its error is the test's
		go func() { defer close(spares); startSpareServers() }()
	} else {
		close(spares)
	}
	code = m.Run()
	closePaperclip(code != 0)
	<-spares
	closeSpareServers()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "realnode: failed; webhook log %s, cluster logs %s\n", in.Webhook.Log, c.Dir+"/logs")
		if os.Getenv("CI") != "" {
			dumpLog(in.Webhook.Log)
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

// ctxT is a context for one test, ended with it.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
