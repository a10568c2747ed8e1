package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// SharedUID and SharedGID own the shared volume's directory, as Paperclip's
// own image (uid 1000) leaves it: the security floor runs agents as 1000
// with fsGroup 1000.
const SharedUID, SharedGID = 1000, 1000

// SharedDir is the shared ReadWriteMany volume of the example Paperclip:
// on a real node its PersistentVolume is this host directory, which the
// relay's mirror writes to as well.
func SharedDir(c *cluster.Cluster) string { return filepath.Join(c.Dir, "shared") }

// realPaperclip prepares the example Paperclip for real containers, before
// examples/paperclip.yaml is applied: its PersistentVolume becomes the
// host directory SharedDir (the example's NFS server does not exist), and
// the fake agent answers to the Paperclip Deployment's image, so an agent
// Job that inherits that image runs the fake agent.
func realPaperclip(ctx context.Context, c *cluster.Cluster) error {
	dir := SharedDir(c)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// setgid: what agents create there keeps the group, as on an NFS
	// export prepared for Paperclip.
	if err := os.Chown(dir, SharedUID, SharedGID); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o775|os.ModeSetgid); err != nil {
		return err
	}
	pv := HostPathVolume("paperclip-data", dir, corev1.ReadWriteMany, "paperclip", "paperclip-data")
	if _, err := c.Clientset().CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("the shared volume on the real node: %w", err)
	}
	image, err := paperclipImage()
	if err != nil {
		return err
	}
	return c.TagImage(ctx, cluster.FakeAgentImage, image)
}

// paperclipImage is the image of the example Paperclip Deployment.
func paperclipImage() (string, error) {
	set, err := readExample("examples/paperclip.yaml")
	if err != nil {
		return "", err
	}
	for _, d := range set.Deployments {
		for _, ct := range d.Spec.Template.Spec.Containers {
			return ct.Image, nil
		}
	}
	return "", fmt.Errorf("examples/paperclip.yaml has no Deployment")
}

// HostPathVolume is a PersistentVolume for one claim, backed by a
// directory of the real node (the suite's node is this machine).
func HostPathVolume(name, dir string, mode corev1.PersistentVolumeAccessMode, claimNamespace, claim string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: claimNamespace, Name: claim},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: dir, Type: ptr.To(corev1.HostPathDirectory)}},
		},
	}
}
