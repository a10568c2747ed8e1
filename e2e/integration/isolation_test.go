package integration

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/templates"
)

// TestARunMountsOnlyItsOwnDirectories: through the API server, a bare
// Job's stored pod template mounts exactly the run's directories of the
// shared claim, each at the path the server sees it with its subPath
// fixed; a Job that mounts the claim otherwise is refused with a 403
// naming the mount. (Every other widening is a hostile fixture of the
// decision, decide/testdata/hostile.)
func TestARunMountsOnlyItsOwnDirectories(t *testing.T) {
	in := newInstall(t)
	ctx := ctxT(t)
	job := in.CreateJob(ctx, t, in.BareJob(t, "e2e-confined"))
	root := "/paperclip/instances/default/"
	agent, company := job.Labels[contract.LabelAgentID], job.Labels[contract.LabelCompanyID]
	want := map[string]bool{ // mount path: read-only
		root + "workspaces/" + agent:                                         false,
		root + "projects/" + company:                                         false,
		root + "companies/" + company + "/agents/" + agent + "/home":         false,
		root + "companies/" + company + "/agents/" + agent + "/instructions": true,
		root + "skills/" + company:                                           true,
	}
	spec := job.Spec.Template.Spec
	for _, m := range spec.Containers[0].VolumeMounts {
		if m.Name != templates.DataVolume {
			continue
		}
		readOnly, ok := want[m.MountPath]
		if !ok || m.ReadOnly != readOnly || m.SubPath != strings.TrimPrefix(m.MountPath, "/paperclip/") || m.SubPathExpr != "" {
			t.Errorf("the run mounts the shared volume as %+v; want only %v", m, want)
		}
		delete(want, m.MountPath)
	}
	if len(want) > 0 {
		t.Errorf("the run does not mount %v", want)
	}
	if i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == templates.DataVolume }); i < 0 ||
		spec.Volumes[i].PersistentVolumeClaim == nil || spec.Volumes[i].PersistentVolumeClaim.ClaimName != "paperclip-data" {
		t.Errorf("the shared volume: %+v", spec.Volumes)
	}
	if wd := spec.Containers[0].WorkingDir; wd != root+"workspaces/"+agent {
		t.Errorf("working directory %q, want the agent's workspace", wd)
	}

	for _, c := range []struct {
		name  string
		mount corev1.VolumeMount
		claim string
		want  string
	}{
		{"e2e-whole-claim", corev1.VolumeMount{Name: "data", MountPath: "/paperclip"}, "paperclip-data",
			`paperclip-data is the shared volume, which clipjob mounts itself`},
		{"e2e-other-company", corev1.VolumeMount{Name: templates.DataVolume, MountPath: "/mnt/x", SubPath: "instances/default/projects/globex"}, "",
			`mounts the shared volume at /mnt/x (subPath "instances/default/projects/globex")`},
		{"e2e-subpathexpr", corev1.VolumeMount{Name: templates.DataVolume, MountPath: "/mnt/y", SubPathExpr: "$(HOME)"}, "",
			`subPathExpr "$(HOME)"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := in.BareJob(t, c.name)
			j.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Command: []string{"claude"}, VolumeMounts: []corev1.VolumeMount{c.mount}}}
			if c.claim != "" {
				j.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: c.mount.Name, VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.claim}}}}
			}
			_, err := suite.cs.BatchV1().Jobs(in.Namespace).Create(ctx, j, metav1.CreateOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want 403 saying %q, got %v", c.want, err)
			}
			in.AssertNoJob(ctx, t, j.Name)
		})
	}
}
