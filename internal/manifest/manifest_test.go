package manifest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

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
