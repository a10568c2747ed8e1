// Package manifest reads and writes the YAML manifests the offline CLI and
// the golden tests work on: multi-document streams of Jobs, Deployments and
// other Kubernetes objects, decoded strictly so a misspelt field is
// reported rather than silently dropped, and documents of kinds the caller
// parses itself (clipjob's Config), kept as written.
package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Set is what a stream holds, by kind, in stream order.
type Set struct {
	Jobs        []*batchv1.Job
	Deployments []*appsv1.Deployment
	// Raw are the documents of the kinds Read was asked to keep raw, as
	// written (clipjob Configs, for config.Parse).
	Raw [][]byte
	// Others are documents of any other kind, decoded into the scheme's
	// types (PersistentVolumeClaims, Secrets, …).
	Others []runtime.Object
}

var (
	scheme  = runtime.NewScheme()
	decoder runtime.Decoder
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	decoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// Read splits r into YAML documents and decodes each by its kind; a
// document of one of the raw kinds (apiVersion and kind) goes to Set.Raw
// as written.
func Read(r io.Reader, raw ...metav1.TypeMeta) (*Set, error) {
	set := &Set{}
	docs := utilyaml.NewYAMLReader(bufio.NewReader(r))
	for i := 1; ; i++ {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return set, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if isEmpty(doc) {
			continue
		}
		if err := set.add(doc, raw); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
	}
}

// add decodes one document into the set. A List (what `kubectl get -o
// yaml` prints for several objects) adds each of its items: taking it for
// one unknown object would lose them without a word.
func (set *Set) add(doc []byte, raw []metav1.TypeMeta) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return err
	}
	if slices.Contains(raw, meta) {
		set.Raw = append(set.Raw, doc)
		return nil
	}
	obj, _, err := decoder.Decode(doc, nil, nil)
	if runtime.IsNotRegisteredError(err) || runtime.IsMissingKind(err) || runtime.IsMissingVersion(err) {
		return fmt.Errorf("%s %s: not a kind this reads (objects of core/v1, apps/v1 and batch/v1, and Lists of them%s)", meta.APIVersion, meta.Kind, rawKinds(raw))
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", meta.APIVersion, meta.Kind, err)
	}
	switch o := obj.(type) {
	case *batchv1.Job:
		set.Jobs = append(set.Jobs, o)
	case *appsv1.Deployment:
		set.Deployments = append(set.Deployments, o)
	case *corev1.List:
		for j, item := range o.Items {
			if err := set.add(item.Raw, raw); err != nil {
				return fmt.Errorf("List item %d: %w", j+1, err)
			}
		}
	default:
		set.Others = append(set.Others, o)
	}
	return nil
}

// rawKinds names the kinds kept raw, for an error listing what is read.
func rawKinds(raw []metav1.TypeMeta) string {
	var b strings.Builder
	for _, k := range raw {
		fmt.Fprintf(&b, "; %s %s", k.APIVersion, k.Kind)
	}
	return b.String()
}

func isEmpty(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		t := strings.TrimSpace(line)
		if t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}

// JobYAML renders a Job as kubectl would show it, without the empty status
// and null creationTimestamp that a client-side object carries.
func JobYAML(job *batchv1.Job) ([]byte, error) {
	j := job.DeepCopy()
	j.APIVersion, j.Kind = "batch/v1", "Job"
	data, err := yaml.Marshal(j)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(data), "\n") {
		switch strings.TrimRight(line, "\n") {
		case "status: {}", "  creationTimestamp: null", "      creationTimestamp: null":
			continue
		}
		out.WriteString(line)
	}
	return out.Bytes(), nil
}
