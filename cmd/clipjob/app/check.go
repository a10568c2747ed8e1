package app

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/paperclipai/clipjob/decide"
)

// errDenied makes check exit 1 after printing every verdict; errUndecided
// exit 3 when no Job was denied but some verdict needs a fact not given.
var (
	errDenied    = errors.New("policy denied at least one Job")
	errUndecided = exitError{code: 3, msg: "at least one verdict needs a fact not given (see undecided above)"}
)

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func check(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	f := newFlags("check", `Job manifest(s) to check ("-" for stdin)`, stderr)
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
	if len(jobs.Jobs) == 0 {
		return fmt.Errorf("%s holds no Job", *f.jobFile)
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
			fmt.Fprintf(stdout, "job/%s: not an agent Job (no paperclip.io/ label on it or its pods); clipjob leaves it alone\n", job.Name)
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
	fmt.Fprintln(stderr, "Note: one active run per agent needs the cluster's claims; `clipjob check` does not evaluate it.")
	switch {
	case denied:
		return errDenied
	case undecided:
		return errUndecided
	}
	return nil
}

func webhookName(stage string) string {
	if stage == decide.StageMutate {
		return "mutating"
	}
	return "validating"
}
