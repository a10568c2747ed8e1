package relay

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/bolt"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// TestServeRefusesToStart: options it cannot serve with stop Serve before
// it opens the store or reaches the API server, naming every one.
func TestServeRefusesToStart(t *testing.T) {
	err := Serve(context.Background(), Options{})
	for _, want := range []string{"RestConfig is required", "--data-dir (DataDir) is required", "--max-streams (MaxStreams) must be positive, not 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero options: %v does not say %q", err, want)
		}
	}
	o := DefaultOptions()
	o.RestConfig, o.DataDir = &rest.Config{Host: "https://127.0.0.1:1"}, t.TempDir()
	o.RedactPatterns = []string{"("}
	if err := Serve(context.Background(), o); err == nil || !strings.Contains(err.Error(), "redaction patterns") {
		t.Errorf("invalid redaction pattern: %v", err)
	}
	// Running without the values it was told to redact would store them.
	o.RedactPatterns, o.RedactValuesFile = nil, filepath.Join(t.TempDir(), "missing")
	if err := Serve(context.Background(), o); err == nil || !strings.Contains(err.Error(), "redaction values") || !strings.Contains(err.Error(), "missing") {
		t.Errorf("unreadable redaction values file: %v", err)
	}
}

// The relay is ready only once its API accepts connections: a restarted
// relay said ready (its pod cache synced) before the service had opened
// the API's listener, and refused its first clients.
func TestAPIReadyOnlyWhenListening(t *testing.T) {
	s := &service{opts: Options{APIAddr: "127.0.0.1:0"}, log: logr.Discard()}
	if s.apiReady(nil) == nil {
		t.Fatal("ready before the API listens")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopAPI, _, err := s.serveAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.apiReady(nil); err != nil {
		t.Fatalf("not ready while listening: %v", err)
	}
	stopAPI(time.Second)

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	taken := &service{opts: Options{APIAddr: busy.Addr().String()}, log: logr.Discard()}
	if _, _, err := taken.serveAPI(ctx); err == nil || taken.apiReady(nil) == nil {
		t.Fatalf("an API that could not listen (%v) reads as ready", err)
	}
}

// TestServeOpensTheStoreItIsTold: bbolt in the data directory by default,
// PostgreSQL with --store=postgres and a connection string read from a
// file or the environment, never from a flag; a store it cannot open is
// named.
func TestServeOpensTheStoreItIsTold(t *testing.T) {
	o := DefaultOptions()
	o.DataDir = t.TempDir()
	s, err := openStore(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*bolt.Store); !ok {
		t.Errorf("default store %T, want bbolt's", s)
	}
	s.Close()

	o.Store = "sqlite"
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), `--store (Store) "sqlite"`) {
		t.Errorf("an unknown store: %v", err)
	}
	o.Store = StorePostgres
	t.Setenv(PostgresURLEnv, "")
	if _, err := openStore(context.Background(), o); err == nil || !strings.Contains(err.Error(), PostgresURLEnv) || !strings.Contains(err.Error(), "--postgres-url-file") {
		t.Errorf("postgres without a connection string: %v", err)
	}

	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	o.PostgresURLFile = filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(o.PostgresURLFile, []byte(srv.ConnString("postgres")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.PostgresSchema = "relay_from_file"
	s, err = openStore(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*postgres.Store); !ok {
		t.Errorf("store %T, want PostgreSQL's", s)
	}
	if _, err := s.UpdateRun("run-1", func(r *store.Run) { r.Phase = "Running" }); err != nil {
		t.Errorf("writing to the PostgreSQL store: %v", err)
	}
	s.Close()

	o.PostgresURLFile = ""
	t.Setenv(PostgresURLEnv, srv.ConnString("postgres"))
	o.PostgresSchema = "relay_from_env"
	s, err = openStore(context.Background(), o)
	if err != nil {
		t.Fatalf("connection string from %s: %v", PostgresURLEnv, err)
	}
	s.Close()
}

// TestTheCacheKeepsWhatTheRelayReadsOfAPod: the pod cache stores a slim
// pod: every field the collector reads (metadata, container names in
// order, status) is kept as it was, and the webhook's injected env,
// volumes and the managed fields and annotations are not.
func TestTheCacheKeepsWhatTheRelayReadsOfAPod(t *testing.T) {
	now := metav1.Now()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "run-1-abcde", Namespace: "paperclip", UID: "uid-1", CreationTimestamp: now, DeletionTimestamp: &now,
			Labels:          map[string]string{"paperclip.io/agent-id": "a", "clipjob.paperclip.io/run-id": "run-1"},
			Annotations:     map[string]string{"clipjob.paperclip.io/profile": strings.Repeat("x", 4096)},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: "run-1", UID: "job-uid", Controller: ptr.To(true)}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "setup", Image: "img", Env: []corev1.EnvVar{{Name: "A", Value: "1"}}}},
			Containers: []corev1.Container{{Name: "agent", Image: "img", Env: []corev1.EnvVar{{Name: "SECRET", Value: "s"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "paperclip", MountPath: "/paperclip"}}}, {Name: "sidecar"}},
			Volumes: []corev1.Volume{{Name: "paperclip"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodSucceeded, StartTime: &now,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error"}}}}},
	}
	out, err := slimPod(pod.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	slim := out.(*corev1.Pod)
	want := pod.ObjectMeta.DeepCopy()
	want.ManagedFields, want.Annotations = nil, nil
	if !equality.Semantic.DeepEqual(slim.ObjectMeta, *want) || !equality.Semantic.DeepEqual(slim.Status, pod.Status) {
		t.Errorf("metadata or status changed:\n%+v\n%+v", slim.ObjectMeta, slim.Status)
	}
	var names []string
	for _, cs := range [][]corev1.Container{slim.Spec.InitContainers, slim.Spec.Containers} {
		for _, c := range cs {
			names = append(names, c.Name)
			if !equality.Semantic.DeepEqual(c, corev1.Container{Name: c.Name}) {
				t.Errorf("container %s kept more than its name: %+v", c.Name, c)
			}
		}
	}
	if strings.Join(names, ",") != "setup,agent,sidecar" || slim.Spec.Containers[0].Name != "agent" {
		t.Errorf("containers %v, want setup,agent,sidecar with the agent first of the app containers", names)
	}
	if len(slim.Spec.Volumes) != 0 || slim.Annotations != nil || slim.ManagedFields != nil {
		t.Errorf("kept volumes %v, annotations %v, managed fields %v", slim.Spec.Volumes, slim.Annotations, slim.ManagedFields)
	}
	if other, _ := slimPod("not a pod"); other != "not a pod" {
		t.Errorf("a tombstone or other object came back as %v", other)
	}
}
