package command

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/paperclipai/clipjob/internal/testing/kube"
)

func TestFlagTypes(t *testing.T) {
	var qps Float32 = 5
	var list List
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Var(&qps, "qps", "")
	fs.Var(&list, "item", "")
	if err := fs.Parse([]string{"--qps", "2.5", "--item", "a", "--item", "b"}); err != nil {
		t.Fatal(err)
	}
	if qps != 2.5 || qps.String() != "2.5" {
		t.Errorf("qps %v", qps)
	}
	if len(list) != 2 || list.String() != "a,b" {
		t.Errorf("list %v", list)
	}
	if err := fs.Parse([]string{"--qps", "fast"}); err == nil {
		t.Error("a QPS that is not a number was accepted")
	}
}

func TestRestConfigFromKubeconfig(t *testing.T) {
	path := kube.Kubeconfig(t)
	rc, err := RestConfig(path)
	if err != nil || rc.Host != kube.Host || rc.BearerToken != kube.Token {
		t.Fatalf("%+v, %v", rc, err)
	}
	if _, err := RestConfig(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing kubeconfig gave API access")
	}
}
