package manifest

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzRead: the CLI's manifest reader answers any input with objects or
// an error, never a panic.
func FuzzRead(f *testing.F) {
	f.Add([]byte("apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\n---\napiVersion: apps/v1\nkind: Deployment\n"))
	f.Add([]byte("apiVersion: clipjob.paperclip.io/v1alpha1\nkind: Config\n"))
	f.Add([]byte("---\n# only a comment\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := Read(bytes.NewReader(data), metav1.TypeMeta{APIVersion: "clipjob.paperclip.io/v1alpha1", Kind: "Config"})
		if err != nil {
			return
		}
		for _, j := range set.Jobs {
			if _, err := JobYAML(j); err != nil {
				t.Fatalf("a decoded Job does not encode: %v", err)
			}
		}
	})
}
