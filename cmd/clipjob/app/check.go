package app

import (
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// errDenied makes check exit 1 after printing every verdict.
var errDenied = errors.New("policy denied at least one Job")

func check(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	f := newFlags("check", `Job manifest(s) to check ("-" for stdin)`, stderr)
	pvcFile := f.fs.String("pvc", "", "manifest(s) of the PersistentVolumeClaims the Jobs mount (default: the volume rule is not checked)")
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
	var inh *templates.Inherited
	var sourceImages []string
	if *f.srcFile != "" {
		if inh, err = loadSource(*f.srcFile, cfg); err != nil {
			return err
		}
		sourceImages = []string{inh.Image}
	}
	var claims policy.ClaimLookup
	if *pvcFile != "" {
		set, err := readManifests(*pvcFile, nil)
		if err != nil {
			return err
		}
		pvcs := map[string]*corev1.PersistentVolumeClaim{}
		for _, o := range set.Others {
			if p, ok := o.(*corev1.PersistentVolumeClaim); ok {
				pvcs[p.Namespace+"/"+p.Name] = p
			}
		}
		claims = func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			if p, ok := pvcs[ns+"/"+name]; ok {
				return p, nil
			}
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "persistentvolumeclaims"}, name)
		}
	}
	jobs, err := readManifests(*f.jobFile, stdin)
	if err != nil {
		return err
	}
	if len(jobs.Jobs) == 0 {
		return fmt.Errorf("%s holds no Job", *f.jobFile)
	}
	denied := false
	for _, job := range jobs.Jobs {
		if !contract.IsAgentJob(job.Labels) {
			fmt.Fprintf(stdout, "job/%s: skipped (no label %s)\n", job.Name, contract.LabelAgentID)
			continue
		}
		if inh != nil {
			res, err := templates.Render(templates.Input{Job: job, Inherited: inh, Config: cfg})
			if err != nil {
				fmt.Fprintf(stdout, "job/%s: denied by the mutating webhook: %v\n", job.Name, err)
				denied = true
				continue
			}
			job = res.Job
		}
		var shared []string
		if inh != nil {
			shared = inh.SharedSecrets(cfg.Source.Env.Deny)
		}
		d := policy.Evaluate(policy.Input{Operation: policy.Create, Job: job, Config: cfg, SourceImages: sourceImages, Claims: claims, SharedSecrets: shared})
		for _, w := range d.Warnings {
			fmt.Fprintf(stderr, "Warning: job/%s: %s\n", job.Name, w)
		}
		if !d.Allowed() {
			fmt.Fprintf(stdout, "job/%s: denied: %s\n", job.Name, d.Errs.ToAggregate())
			denied = true
			continue
		}
		fmt.Fprintf(stdout, "job/%s: allowed\n", job.Name)
	}
	fmt.Fprintln(stderr, "Note: one active run per agent needs the cluster's claims; `clipjob check` does not evaluate it.")
	if denied {
		return errDenied
	}
	return nil
}
