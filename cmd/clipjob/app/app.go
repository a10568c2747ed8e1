// Package app is the clipjob command line: `render` and `check` of agent
// Jobs offline, calling the same cores as the webhook (templates.Render,
// policy.Evaluate), the way istioctl kube-inject calls Istio's injector;
// and the two that reach a cluster: `doctor`, to check an install, and
// `dashboard`, serving the runs page (package dashboard) with the
// viewer's kubeconfig.
// main only calls Main, so every command is tested without a process.
package app

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/policy"
)

const usage = `clipjob renders Paperclip agent Jobs as the clipjob webhook would.

Usage:
  clipjob render -f job.yaml [--source deployment.yaml] [--config config.yaml]
  clipjob render --policies --source deployment.yaml [--config config.yaml]
  clipjob check  -f job.yaml [--source deployment.yaml] [--objects objects.yaml]... [--config config.yaml]
  clipjob doctor [--namespace clipjob-system] [--release clipjob] [--values values.yaml] [-o json]
  clipjob dashboard [--namespace ns]... [--relay-url URL --relay-token-file FILE [--relay-ca-file ca.crt]]

Commands:
  render   print the complete Job(s) the webhook would store for a bare Job;
           with --policies, the MutatingAdmissionPolicies that complete bare
           Jobs in the source's namespace the same way in the API server
  check    decide Job(s) as the cluster would on create: complete them as the
           mutating webhook does, then judge them as the validating one;
           exit 0 all admitted, 1 one denied, 3 one undecided (a Secret,
           PVC or the source not given: it says what the cluster would do)
  (--source is the source Deployment's manifest; Secrets and PVCs in it
  count as --objects. A tenant namespace's Job needs neither.)
  doctor   check a live install and name the fix for each failure (exit 1)
  dashboard  serve the runs page on loopback with your kubeconfig: who runs,
           who waits and behind whom, refusals, live logs, costs

Run 'clipjob COMMAND -h' for the flags of a command.
`

// Main runs the CLI and returns the process exit code: 0 success, 1 a
// render or policy failure, 2 a usage error, 3 a verdict that needs a fact
// not given.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "render":
		return run(render, args[1:], stdin, stdout, stderr)
	case "check":
		return run(check, args[1:], stdin, stdout, stderr)
	case "doctor":
		return run(doctorCmd, args[1:], stdin, stdout, stderr)
	case "dashboard":
		return run(dashboardCmd, args[1:], stdin, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "clipjob: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

type usageError struct{ error }

// exitError ends a command with its own exit code.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

func run(cmd func([]string, io.Reader, io.Writer, io.Writer) error, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := cmd(args, stdin, stdout, stderr)
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "clipjob:", err)
		return 2
	case errors.As(err, &ee):
		fmt.Fprintln(stderr, "clipjob:", err)
		return ee.code
	default:
		fmt.Fprintln(stderr, "clipjob:", err)
		return 1
	}
}

// commonFlags are the inputs every command reads.
type commonFlags struct {
	fs                        *flag.FlagSet
	jobFile, cfgFile, srcFile *string
}

func newFlags(name, jobHelp string, stderr io.Writer) commonFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return commonFlags{
		fs:      fs,
		jobFile: fs.String("f", "", jobHelp),
		cfgFile: fs.String("config", "", "clipjob Config file (default: the built-in configuration)"),
		srcFile: fs.String("source", "", "manifest of the source Deployment (the Paperclip server)"),
	}
}

func (c commonFlags) parse(args []string) error {
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	return nil
}

func render(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	f := newFlags("render", `Job manifest(s) to render ("-" for stdin); other core/v1, apps/v1 and batch/v1 objects in it are skipped`, stderr)
	policies := f.fs.Bool("policies", false, "print the MutatingAdmissionPolicies and bindings compiled from the source and config, instead of rendering Jobs")
	if err := f.parse(args); err != nil {
		return err
	}
	if *policies {
		if *f.jobFile != "" || *f.srcFile == "" {
			f.fs.Usage()
			return usageError{errors.New("render --policies needs --source and no -f: the policies are compiled from the source, for any Job")}
		}
		return renderPolicies(*f.cfgFile, *f.srcFile, stdout)
	}
	if *f.jobFile == "" {
		f.fs.Usage()
		return usageError{errors.New("render needs -f")}
	}
	cfg, err := loadConfig(*f.cfgFile)
	if err != nil {
		return err
	}
	facts, err := readFacts(cfg, *f.srcFile, nil)
	if err != nil {
		return err
	}
	jobs, err := readManifests(*f.jobFile, stdin)
	if err != nil {
		return err
	}
	if len(jobs.Jobs) == 0 {
		return fmt.Errorf("%s holds no Job", *f.jobFile)
	}
	var out bytes.Buffer
	for i, job := range jobs.Jobs {
		defaultNamespace(job, cfg, stderr)
		if i > 0 {
			out.WriteString("---\n")
		}
		m := decide.Mutate(decide.Input{Operation: policy.Create, Job: job, Config: cfg, Facts: facts.decide()})
		switch {
		case m.Kind != decide.AgentRun:
			fmt.Fprintf(stderr, "clipjob: Job %s has no label %s; left as it is\n", job.Name, contract.LabelAgentID)
		case m.Undecided != nil:
			return usageError{fmt.Errorf("job %s: %s was not given: %s", job.Name, m.Undecided.Fact, m.Undecided.Give)}
		case m.Refusal != nil:
			return fmt.Errorf("job %s: %s", job.Name, m.Refusal.Message)
		default:
			for _, w := range m.Result.Warnings {
				fmt.Fprintf(stderr, "Warning: Job %s: %s\n", job.Name, w)
			}
			job = m.Result.Job
		}
		y, err := manifest.JobYAML(job)
		if err != nil {
			return err
		}
		out.Write(y)
	}
	_, err = stdout.Write(out.Bytes())
	return err
}

// defaultNamespace puts a Job that names no namespace in the source's, as
// a client whose context is that namespace would, and says so: which
// namespace a Job is in decides what it inherits.
func defaultNamespace(job *batchv1.Job, cfg *config.Config, stderr io.Writer) {
	if job.Namespace == "" {
		job.Namespace = cfg.Source.Namespace
		fmt.Fprintf(stderr, "clipjob: Job %s names no namespace; taken to be %s (the source's)\n", job.Name, job.Namespace)
	}
}

func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return config.Default(), nil
	}
	return config.Load(path)
}

func readManifests(path string, stdin io.Reader) (*manifest.Set, error) {
	var r io.Reader
	if path == "-" {
		if stdin == nil {
			return nil, usageError{errors.New(`"-" (stdin) can be used once`)}
		}
		r = stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	set, err := manifest.Read(r, config.TypeMeta)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, nil
}
