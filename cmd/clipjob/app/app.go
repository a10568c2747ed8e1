// Package app is the clipjob command line: `render` and `check` of agent
// Jobs offline, calling the same cores as the webhook (templates.Render,
// policy.Evaluate), the way istioctl kube-inject calls Istio's injector;
// and `doctor`, the one command that reaches a cluster, to check an
// install.
// main only calls Main, so every command is tested without a process.
package app

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/contract"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/templates"
)

const usage = `clipjob renders Paperclip agent Jobs as the clipjob webhook would.

Usage:
  clipjob render -f job.yaml --source deployment.yaml [--config config.yaml]
  clipjob check  -f job.yaml [--source deployment.yaml] [--pvc pvc.yaml] [--config config.yaml]
  clipjob doctor [--namespace clipjob-system] [--release clipjob] [--values values.yaml] [-o json]

Commands:
  render   print the complete Job(s) the webhook would store for a bare Job
  check    evaluate Job(s) against the policy as the validating webhook does;
           with --source, render them first, as the mutating webhook would
  doctor   check a live install and name the fix for each failure (exit 1)

Run 'clipjob COMMAND -h' for the flags of a command.
`

// Main runs the CLI and returns the process exit code: 0 success, 1 a
// render or policy failure, 2 a usage error.
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
	default:
		fmt.Fprintf(stderr, "clipjob: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

type usageError struct{ error }

func run(cmd func([]string, io.Reader, io.Writer, io.Writer) error, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := cmd(args, stdin, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "clipjob:", err)
		return 2
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
	f := newFlags("render", `Job manifest(s) to render ("-" for stdin); other kinds pass through`, stderr)
	fs, jobFile, cfgFile, srcFile := f.fs, f.jobFile, f.cfgFile, f.srcFile
	if err := f.parse(args); err != nil {
		return err
	}
	if *jobFile == "" || *srcFile == "" {
		fs.Usage()
		return usageError{errors.New("render needs -f and --source")}
	}
	cfg, err := loadConfig(*cfgFile)
	if err != nil {
		return err
	}
	inh, err := loadSource(*srcFile, cfg)
	if err != nil {
		return err
	}
	jobs, err := readManifests(*jobFile, stdin)
	if err != nil {
		return err
	}
	if len(jobs.Jobs) == 0 {
		return fmt.Errorf("%s holds no Job", *jobFile)
	}
	var out bytes.Buffer
	for i, job := range jobs.Jobs {
		if i > 0 {
			out.WriteString("---\n")
		}
		if !contract.IsAgentJob(job.Labels) {
			fmt.Fprintf(stderr, "clipjob: Job %s has no label %s; left as it is\n", job.Name, contract.LabelAgentID)
		} else {
			res, err := templates.Render(templates.Input{Job: job, Inherited: inh, Config: cfg})
			if err != nil {
				return fmt.Errorf("job %s: %w", job.Name, err)
			}
			for _, w := range res.Warnings {
				fmt.Fprintf(stderr, "Warning: Job %s: %s\n", job.Name, w)
			}
			job = res.Job
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

func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return config.Default(), nil
	}
	return config.Load(path)
}

func loadSource(path string, cfg *config.Config) (*templates.Inherited, error) {
	set, err := readManifests(path, nil)
	if err != nil {
		return nil, err
	}
	for _, d := range set.Deployments {
		if d.Name == cfg.Source.Deployment && (d.Namespace == "" || d.Namespace == cfg.Source.Namespace) {
			if d.Namespace == "" {
				d.Namespace = cfg.Source.Namespace
			}
			return templates.InheritFromDeployment(d, cfg.Source)
		}
	}
	return nil, fmt.Errorf("%s holds no Deployment %s/%s (the configured source)", path, cfg.Source.Namespace, cfg.Source.Deployment)
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
	set, err := manifest.Read(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, nil
}
