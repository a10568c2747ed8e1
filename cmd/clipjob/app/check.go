package app

import (
	"errors"
	"fmt"
	"io"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/policy"
)

// errDenied makes check exit 1 after printing every verdict; errUndecided
// exit 3 when no Job was denied but some verdict needs a fact not given.
var (
	errDenied    = errors.New("policy denied at least one Job or Pod")
	errUndecided = exitError{code: 3, msg: "at least one verdict needs a fact not given (see undecided above)"}
)

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func check(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	f := newFlags("check", `Job or Pod manifest(s) to check ("-" for stdin)`, stderr)
	var objects stringList
	f.fs.Var(&objects, "objects", "manifest(s) of the Secrets and PersistentVolumeClaims the Jobs reference, as the cluster has them (repeatable); a referenced object in none of them leaves its rule undecided")
	f.fs.Var(&objects, "pvc", "the same as --objects")
	complete := f.fs.Bool("objects-complete", false, "the --source and --objects files hold every Secret and PVC the Jobs could reference: one in none of them does not exist (as in a namespace exported with kubectl get secrets,pvc -o yaml)")
	if err := f.parse(args); err != nil {
		return err
	}
	if *f.jobFile == "" {
		f.fs.Usage()
		return usageError{errors.New("check needs -f")}
	}
	cfg, err := loadConfig(*f.cfgFile)
	if err != nil {
		return err
	}
	facts, err := readFacts(cfg, *f.srcFile, objects)
	if err != nil {
		return err
	}
	facts.complete = *complete
	jobs, err := readManifests(*f.jobFile, stdin)
	if err != nil {
		return err
	}
	pods := podsOf(jobs)
	if len(jobs.Jobs) == 0 && len(pods) == 0 {
		return fmt.Errorf("%s holds no Job or Pod", *f.jobFile)
	}
	denied, undecided := false, false
	for _, job := range jobs.Jobs {
		defaultNamespace(job, cfg, stderr)
		v := decide.Create(decide.Input{Job: job, Config: cfg, Facts: facts.decide()})
		for _, w := range v.Warnings {
			fmt.Fprintf(stderr, "Warning: job/%s: %s\n", job.Name, w)
		}
		switch {
		case v.Kind == decide.NotAgent:
			// Its pods are the Job controller's, judged by the pod rule
			// (the shared claim is the agents' and the server's).
			d, u := checkPod(stdout, "job/"+job.Name, jobsPod(job), policy.JobControllers[0], cfg, facts)
			denied, undecided = denied || d, undecided || u
			if !d && !u {
				fmt.Fprintf(stdout, "job/%s: not an agent Job (no paperclip.io/ label on it or its pods), and its pods do not mount the shared claim; clipjob leaves it alone\n", job.Name)
			}
		case v.Refusal != nil:
			fmt.Fprintf(stdout, "job/%s: denied by the %s webhook (%d %s): %s\n", job.Name, webhookName(v.Stage), v.Refusal.Code, v.Refusal.Reason, v.Refusal.Message)
			denied = true
		case len(v.Undecided) > 0:
			for _, u := range v.Undecided {
				fmt.Fprintf(stdout, "job/%s: undecided: %s\n", job.Name, u)
			}
			undecided = true
		default:
			fmt.Fprintf(stdout, "job/%s: allowed\n", job.Name)
		}
	}
	for _, pod := range pods {
		if pod.Namespace == "" {
			pod.Namespace = cfg.Source.Namespace
		}
		// A Pod manifest is created by whoever applies it, not a controller.
		d, u := checkPod(stdout, "pod/"+pod.Name, pod, "", cfg, facts)
		denied, undecided = denied || d, undecided || u
		if !d && !u {
			fmt.Fprintf(stdout, "pod/%s: allowed\n", pod.Name)
		}
	}
	fmt.Fprintln(stderr, "Note: one active run per agent needs the cluster's claims; `clipjob check` does not evaluate it.")
	switch {
	case denied:
		return errDenied
	case undecided:
		return errUndecided
	}
	return nil
}

// checkPod prints the pod webhook's verdict on pod when it refuses or
// hangs on a fact, and says which.
func checkPod(stdout io.Writer, what string, pod *corev1.Pod, creator string, cfg *config.Config, facts *offlineFacts) (denied, undecided bool) {
	v := decide.Pod(decide.PodInput{Operation: policy.Create, Pod: pod, Creator: creator, Config: cfg, Facts: facts.decide()})
	switch {
	case v.Refusal != nil:
		fmt.Fprintf(stdout, "%s: denied by the pod webhook (%d %s): %s\n", what, v.Refusal.Code, v.Refusal.Reason, v.Refusal.Message)
		return true, false
	case len(v.Undecided) > 0:
		for _, u := range v.Undecided {
			fmt.Fprintf(stdout, "%s: undecided: %s\n", what, u)
		}
		return false, true
	}
	return false, false
}

// jobsPod is the pod the Job controller makes of job.
func jobsPod(job *batchv1.Job) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: job.Name, Namespace: job.Namespace, Labels: job.Spec.Template.Labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}},
		Spec: *job.Spec.Template.Spec.DeepCopy()}
}

// podsOf are the Pods among the manifests' other documents.
func podsOf(set *manifest.Set) []*corev1.Pod {
	var pods []*corev1.Pod
	for _, o := range set.Others {
		if p, ok := o.(*corev1.Pod); ok {
			pods = append(pods, p)
		}
	}
	return pods
}

func webhookName(stage string) string {
	if stage == decide.StageMutate {
		return "mutating"
	}
	return "validating"
}
