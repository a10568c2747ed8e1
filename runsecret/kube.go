package runsecret

import (
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
)

// KubeSecrets reads Secrets' metadata through the metadata API (the data
// never reaches clipjob) and adds owners with a strategic merge patch,
// which merges owner references by UID rather than replacing them.
type KubeSecrets struct {
	Meta   metadata.Interface
	Client kubernetes.Interface
}

var _ SecretAPI = KubeSecrets{}

// Metadata implements SecretAPI.
func (k KubeSecrets) Metadata(ctx context.Context, ns, name string) (*metav1.ObjectMeta, error) {
	m, err := k.Meta.Resource(corev1.SchemeGroupVersion.WithResource("secrets")).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return &m.ObjectMeta, nil
}

// AddOwner implements SecretAPI.
func (k KubeSecrets) AddOwner(ctx context.Context, ns, name string, owner metav1.OwnerReference) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{owner}}})
	if err != nil {
		return err
	}
	_, err = k.Client.CoreV1().Secrets(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	return err
}
