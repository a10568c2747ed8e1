// Package app is the clipjob-relay command: its flags, bound to
// relay.DefaultOptions so each default is written once, and the start of
// relay.Serve with a logger, API access and the redaction values file.
// main only calls Main, so the whole command is testable without a
// cluster.
package app

import (
	"context"
	"flag"
	"io"
	"os"
	"runtime/debug"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/paperclipai/clipjob/internal/command"
	"github.com/paperclipai/clipjob/relay"
)

// Options are the relay's options and what the command alone needs.
type Options struct {
	relay.Options
	command.Server
}

// NewFlags returns the command's flags bound to o; their defaults are
// o's values.
func NewFlags(o *Options) *flag.FlagSet {
	fs := flag.NewFlagSet("clipjob-relay", flag.ContinueOnError)
	o.Options.BindFlags(fs)
	o.Server.BindFlags(fs)
	return fs
}

// Parse returns the options that args select, starting from the defaults.
func Parse(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{Options: relay.DefaultOptions()}
	fs := NewFlags(o)
	if err := command.ParseFlags(fs, args, stderr); err != nil {
		return nil, err
	}
	return o, nil
}

// Main runs the command with args and returns the process exit code: 0
// after a clean stop, 1 when the relay fails or cannot start, 2 on a usage
// error. run is relay.Serve outside tests.
func Main(ctx context.Context, args []string, stderr io.Writer, run func(context.Context, relay.Options) error) int {
	setGCPercent()
	memMsg, memKV := setMemoryLimit()
	var o *Options
	return command.ServerMain(ctx, "clipjob-relay", stderr, func() (*command.Server, error) {
		var err error
		if o, err = Parse(args, stderr); err != nil {
			return nil, err
		}
		return &o.Server, nil
	}, func(ctx context.Context, log logr.Logger, cfg *rest.Config) error {
		o.Log, o.RestConfig = log, cfg
		log.Info(memMsg, memKV...)
		return run(ctx, o.Options)
	})
}

// GCPercent is the relay's GOGC unless the environment sets one. Go's
// 100 lets the heap grow to twice what is live before collecting: at 500
// runs the relay's live heap peaks during a flood (lines read, queued and
// committing), and its resident memory followed at twice that
// (docs/design/2026-11-26-relay-memory-per-stream.md). Collecting at one
// and a half times costs the relay more CPU in collections, measured there
// too.
const GCPercent = 50

// setGCPercent applies GCPercent unless $GOGC chose.
func setGCPercent() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(GCPercent)
	}
}
