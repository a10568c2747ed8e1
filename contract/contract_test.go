package contract

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/utils/ptr"
)

func TestIsAgentJob(t *testing.T) {
	cases := []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{name: "no labels", labels: nil, want: false},
		{name: "run id alone", labels: map[string]string{LabelRunID: "r"}, want: false},
		{name: "agent id", labels: map[string]string{LabelAgentID: "a"}, want: true},
		{name: "empty agent id still marks a run", labels: map[string]string{LabelAgentID: ""}, want: true},
	}
	for _, c := range cases {
		if got := IsAgentJob(c.labels); got != c.want {
			t.Errorf("%s: IsAgentJob = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestAdapterType(t *testing.T) {
	cases := []struct {
		name   string
		labels map[string]string
		want   string
	}{
		{name: "none", labels: map[string]string{}, want: ""},
		{name: "canonical", labels: map[string]string{LabelAdapterType: "claude_local"}, want: "claude_local"},
		{name: "alias", labels: map[string]string{LabelAdapter: "opencode_k8s"}, want: "opencode_k8s"},
		{name: "canonical wins", labels: map[string]string{LabelAdapterType: "claude_local", LabelAdapter: "opencode_k8s"}, want: "claude_local"},
		{name: "empty canonical falls back", labels: map[string]string{LabelAdapterType: "", LabelAdapter: "pi"}, want: "pi"},
	}
	for _, c := range cases {
		if got := AdapterType(c.labels); got != c.want {
			t.Errorf("%s: AdapterType = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestHasContractLabel(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets []map[string]string
		want bool
	}{
		{name: "none", sets: []map[string]string{nil, {"app": "x"}}},
		{name: "on the Job", sets: []map[string]string{{LabelAgentID: "a"}, nil}, want: true},
		{name: "only on the template", sets: []map[string]string{{"app": "x"}, {LabelEgress: "open"}}, want: true},
		{name: "a look-alike prefix", sets: []map[string]string{{"paperclip.io.evil/x": "1", "xpaperclip.io/y": "1"}}},
	} {
		if got := HasContractLabel(tc.sets...); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSuspended(t *testing.T) {
	for _, tc := range []struct {
		suspend *bool
		want    bool
	}{{nil, false}, {ptr.To(false), false}, {ptr.To(true), true}} {
		job := &batchv1.Job{Spec: batchv1.JobSpec{Suspend: tc.suspend}}
		if got := Suspended(job); got != tc.want {
			t.Errorf("suspend %v: Suspended %v, want %v", tc.suspend, got, tc.want)
		}
	}
}
