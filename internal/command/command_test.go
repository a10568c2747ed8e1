package command

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

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

// TestServerMain: the exit codes and messages both server commands give,
// and what run is handed.
func TestServerMain(t *testing.T) {
	kubeconfig := kube.Kubeconfig(t)
	parse := func(args ...string) func() (*Server, error) {
		return func() (*Server, error) {
			s := &Server{}
			fs := flag.NewFlagSet("srv", flag.ContinueOnError)
			s.BindFlags(fs)
			return s, ParseFlags(fs, args, &bytes.Buffer{})
		}
	}
	var got *rest.Config
	ok := func(_ context.Context, log logr.Logger, cfg *rest.Config) error {
		if log.GetSink() == nil {
			return errors.New("no logger")
		}
		got = cfg
		return nil
	}
	failing := func(context.Context, logr.Logger, *rest.Config) error { return errors.New("port taken") }
	for _, tc := range []struct {
		name  string
		parse func() (*Server, error)
		run   func(context.Context, logr.Logger, *rest.Config) error
		code  int
		want  string
	}{
		{"runs", parse("--kubeconfig", kubeconfig), ok, 0, ""},
		{"help", parse("-h"), ok, 0, ""},
		{"unknown flag", parse("--bogus"), ok, 2, "srv: flag provided but not defined: -bogus"},
		{"argument", parse("--kubeconfig", kubeconfig, "extra"), ok, 2, `srv: unexpected arguments ["extra"]: srv takes only flags`},
		{"no API", parse("--kubeconfig", filepath.Join(t.TempDir(), "none")), ok, 1, "srv: no Kubernetes API access:"},
		{"run fails", parse("--kubeconfig", kubeconfig), failing, 1, "port taken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			got = nil
			code := ServerMain(context.Background(), "srv", &stderr, tc.parse, tc.run)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
			if tc.name == "runs" && (got == nil || got.Host != kube.Host) {
				t.Errorf("run got API access %+v, want %s", got, kube.Host)
			}
		})
	}
}
