package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var logsGVR = schema.GroupVersionResource{Group: "kwok.x-k8s.io", Version: "v1alpha1", Resource: "logs"}

// PodLog is the log file kwok serves for every container of one pod, in
// the CRI format a kubelet reads (timestamp, stream, tag, message).
type PodLog struct {
	Path string
	mu   sync.Mutex
}

// PodLog points the pod's container logs at a new file and returns it.
// kwok serves it through its kubelet endpoint, so the API server's
// pods/log (and `kubectl logs -f`) follows what the test writes.
func (c *Cluster) PodLog(ctx context.Context, namespace, pod string) (*PodLog, error) {
	// A directory per pod, as a kubelet lays logs out: kwok follows a log
	// by watching its directory, and with every pod's file in one
	// directory each write woke every follower (with 200 pods, kwok took
	// a third of the cores and its streams lagged seconds behind).
	dir := filepath.Join(c.Dir, "podlogs", namespace+"_"+pod)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	l := &PodLog{Path: filepath.Join(dir, "agent.log")}
	if err := os.WriteFile(l.Path, nil, 0o644); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
		"metadata": map[string]any{"name": pod, "namespace": namespace},
		"spec":     map[string]any{"logs": []any{map[string]any{"logsFile": l.Path, "follow": true}}},
	}}
	if _, err := dyn.Resource(logsGVR).Namespace(namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return l, nil
}

// Write appends lines to stdout, each stamped with the current time.
func (l *PodLog) Write(lines ...string) error {
	return l.WriteAt(time.Now(), lines...)
}

// WriteAt appends lines that all carry timestamp ts (as a burst does), in
// one write and without fsync, as a container runtime writes its logs:
// kwok reads the file through the page cache, and a sync per write (two
// thousand a second with a thousand pods) made every process on the
// machine wait on the disk's journal, and stamped lines that then waited
// on it before their write.
func (l *PodLog) WriteAt(ts time.Time, lines ...string) error {
	stamp := ts.UTC().Format(time.RFC3339Nano) + " stdout F "
	var b []byte
	for _, line := range lines {
		b = append(append(append(b, stamp...), line...), '\n')
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.OpenFile(l.Path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Close())
}
