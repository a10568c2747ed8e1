package harness

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a clipjob binary running on the host, restartable with the
// same arguments (as a pod restarts with the same volume).
type Process struct {
	// Log is the file its output is appended to.
	Log string
	// ProbeAddr serves its /readyz.
	ProbeAddr string
	bin       string
	args      []string
	cmd       *exec.Cmd
	done      chan error
}

// StartProcess starts bin and waits until its /readyz answers 200.
func StartProcess(ctx context.Context, logFile, probeAddr, bin string, args ...string) (*Process, error) {
	p := &Process{Log: logFile, ProbeAddr: probeAddr, bin: bin, args: args}
	return p, p.Start(ctx)
}

// Start (re)starts the process and waits until it is ready.
func (p *Process) Start(ctx context.Context) error {
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p.cmd, p.done = cmd, make(chan error, 1)
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	// Minutes: a process starting on a machine busy with the whole suite.
	if err := p.waitReady(ctx, 2*time.Minute); err != nil {
		p.Kill()
		return err
	}
	return nil
}

func (p *Process) waitReady(ctx context.Context, timeout time.Duration) error {
	if p.ProbeAddr == "" {
		// Nothing to ask: ready unless it exits at once (a bad flag); the
		// caller waits for what the process does.
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited (%v); see %s", p.bin, err, p.Log)
		case <-time.After(500 * time.Millisecond):
			return nil
		}
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited (%v); see %s", p.bin, err, p.Log)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := http.Get("http://" + p.ProbeAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s; see %s", p.bin, timeout, p.Log)
}

// Stop terminates the process gracefully (SIGTERM, then SIGKILL after 10s).
func (p *Process) Stop() { p.signal(syscall.SIGTERM, 10*time.Second) }

// Kill ends the process at once (SIGKILL): nothing is flushed.
func (p *Process) Kill() { p.signal(syscall.SIGKILL, 10*time.Second) }

func (p *Process) signal(sig syscall.Signal, grace time.Duration) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case err := <-p.done: // already exited
		p.done <- err
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// PID is the running process's id (for its RSS in /proc).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Running reports whether the process has been started and not exited.
func (p *Process) Running() bool { return alive(p.cmd, p.done) }

// alive reports whether cmd was started and has not exited; done carries
// its Wait's error, put back for the next reader.
func alive(cmd *exec.Cmd, done chan error) bool {
	if cmd == nil {
		return false
	}
	select {
	case err := <-done:
		done <- err
		return false
	default:
		return true
	}
}
