package cluster

import (
	"context"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestStartStop brings the control plane up and checks that the API server
// answers with the version it was built as and that the kwok node is Ready.
func TestStartStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; run without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	cs := c.Clientset()
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.Major != "1" || v.GitVersion == "" || v.GitVersion[0] != 'v' || v.GitVersion == "v0.0.0-master+$Format:%H$" {
		t.Errorf("server version %+v: not stamped", v)
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}
