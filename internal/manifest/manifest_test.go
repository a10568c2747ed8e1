package manifest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A document of a kind the caller parses itself is kept as written, in
// stream order among its kind; one the caller did not name is not a
// Kubernetes object either, and is refused rather than dropped.
func TestReadKeepsRawKinds(t *testing.T) {
	stream := "apiVersion: example.com/v1\nkind: Config\nsource: {namespace: a}\n---\n" +
		"apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n---\n" +
		"apiVersion: example.com/v1\nkind: Config\nsource: {namespace: b}\n"
	cfg := metav1.TypeMeta{APIVersion: "example.com/v1", Kind: "Config"}
	set, err := Read(strings.NewReader(stream), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Raw) != 2 || !strings.Contains(string(set.Raw[0]), "namespace: a") || !strings.Contains(string(set.Raw[1]), "namespace: b") || len(set.Jobs) != 1 {
		t.Errorf("raw %q, jobs %d: want both Configs as written, in order, and the Job", set.Raw, len(set.Jobs))
	}
	if _, err := Read(strings.NewReader(stream)); err == nil || !strings.Contains(err.Error(), "document 1: example.com/v1 Config: not a kind this reads") || strings.Contains(err.Error(), "scheme") {
		t.Errorf("a kind nobody named: %v, want an error naming the document and its kind", err)
	}
	if _, err := Read(strings.NewReader(stream), metav1.TypeMeta{APIVersion: "example.com/v2", Kind: "Config"}); err == nil {
		t.Error("another version of a raw kind was kept")
	}
}

// A List, what `kubectl get deploy,secrets,pvc -o yaml` prints, counts as
// its items: read as one unknown object, its Secrets and claims would be
// lost without a word and the CLI would decide on facts it was given but
// did not read.
func TestReadUnpacksLists(t *testing.T) {
	set, err := Read(strings.NewReader(`apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: paperclip, namespace: paperclip}
- apiVersion: v1
  kind: Secret
  metadata: {name: llm-key, namespace: paperclip}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: paperclip-data, namespace: paperclip}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Deployments) != 1 || len(set.Others) != 2 {
		t.Fatalf("deployments %d, others %v", len(set.Deployments), set.Others)
	}
	if _, ok := set.Others[0].(*corev1.Secret); !ok {
		t.Errorf("first item %T, want a Secret", set.Others[0])
	}
	_, err = Read(strings.NewReader("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v9, kind: Nope}\n"))
	if err == nil || !strings.Contains(err.Error(), "document 1: List item 1: v9 Nope:") {
		t.Errorf("an item that cannot be read: %v", err)
	}
}
