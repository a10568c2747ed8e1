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
	if err := makeSharedDir(dir); err != nil {
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

// makeSharedDir makes dir as Paperclip's image leaves its home volume:
// its uid's and gid's, setgid so that what agents create there keeps the
// group, as on an NFS export prepared for Paperclip.
func makeSharedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chown(dir, SharedUID, SharedGID); err != nil {
		return err
	}
	return os.Chmod(dir, 0o775|os.ModeSetgid)
}

// NewAgentNamespace readies namespace ns on the real node for a release
// of the chart of its own (InstallRelease for ns): ns taken out of the
// cluster-wide install shared's webhook configurations, so the release
// alone judges its Jobs, and the example Paperclip there, its shared
// volume a host directory of its own. A test with one runs beside the
// others. The Install it returns runs no webhook; its Job helpers
// (BareJob, CreateJob, WaitPod, AdmissionLoop, ...) act in ns.
func NewAgentNamespace(ctx context.Context, shared *Install, ns string) (*Install, error) {
	if err := shared.ExcludeNamespace(ctx, ns); err != nil {
		return nil, err
	}
	dir := filepath.Join(shared.c.Dir, ns+"-shared")
	if err := makeSharedDir(dir); err != nil {
		return nil, err
	}
	in := &Install{Namespace: ns, Namespaces: []string{ns}, c: shared.c, sharedDir: dir, volumeDir: dir}
	if err := in.applyPaperclip(ctx); err != nil {
		return nil, err
	}
	return in, nil
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
