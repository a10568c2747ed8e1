// Command fakeagent stands in for an agent CLI (claude, opencode, ...) in a
// real container: it reads the prompt on stdin, as the profiles' commands
// give it, and writes what that CLI writes (Claude's stream-json, or
// OpenCode's JSON events), then exits with a chosen code. So a run on a
// real kubelet behaves like an agent run without a model.
//
// The prompt is its script: whitespace-separated key=value words, e.g.
//
//	lines=200 rate=50 burst=1000 bigline=1 probe=1 write=/paperclip/x exit=3
//
//	lines    assistant text lines to write (default 3)
//	rate     lines per second (default 0: as fast as it can)
//	burst    lines more, written at once after the paced ones
//	bigline  lines more of bigsize bytes each (JSON and all)
//	bigsize  default 1 MiB less 64 bytes: just under the relay's line limit
//	probe    1: first, a line describing the container (see probe.go)
//	attack   <agent>@<company>: then, a line of what a hostile agent got
//	         from the shared volume, with tokens forged for that agent
//	         (see attack.go)
//	write    a file to create, then read back (the probe line says how)
//	read     a file to read (the probe line says what it held): relative
//	         to the directory the prompt says to resolve the agent's
//	         instructions' references from, as an agent would
//	skill    a company skill's key: read the SKILL.md the prompt names for
//	         it (the probe line says what it held), as an agent told of
//	         its skills would; instead of read
//	connect  host:port,host:port: try each, 3 s apiece, and print a line
//	         saying which connected (egress policy tests)
//	gate     a file: after its first line, wait (up to 5 minutes) until it
//	         exists (a test lets the agent write once the relay follows it)
//	wait     seconds to wait first, as a real agent does before its first
//	         call out (a network policy controller sees the pod meanwhile)
//	leak     an env variable to print, NAME=value, as a tool result: an
//	         agent that ran `env` (the relay must redact what it prints)
//	pad      bytes to pad each paced and burst line to (a log that grows fast)
//	failonce 1: the first container of the pod exits 1 after its lines; a
//	         restarted one (restartPolicy OnFailure) runs to the end. It
//	         remembers through /tmp, which outlives a container restart.
//	sleep    seconds to wait before the result (a run to cancel, or delete)
//	until    a file: the sleep ends early once it exists (a test ends the
//	         run when it has seen what it waits for, however busy the
//	         machine)
//	exit     the exit code (default 0); non-zero writes an error result
//	result   0: no result event (a run that is cut short)
//	stamp    1: the first event carries written_at, the time it was
//	         written (RFC 3339, ns): make bench times a line's way from
//	         the agent to Paperclip's run log with it
//
// It keeps each session it starts under $HOME/.fakeagent/sessions and
// refuses to resume (--resume, --session) one that is not there, as
// Claude does: a run resumes only what its own home holds.
//
// The binary is installed under each agent CLI's name; argv[0] picks the
// output format. `fakeagent --serve 3100,8080` is instead a server that
// answers every connection on those ports (a stand-in Paperclip server).
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// script is what the prompt asks for.
type script struct {
	lines, burst, bigLines, bigSize, exit, pad int
	rate                                       float64
	probe, result, failOnce, stamp             bool
	write, read, skill, leak, connect, attack  string
	until, gate                                string
	sleep, wait                                time.Duration
}

func parseScript(prompt string) (script, error) {
	s := script{lines: 3, result: true, bigSize: 1<<20 - 64}
	for _, w := range strings.Fields(prompt) {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			continue // words of a real prompt: not part of the script
		}
		var err error
		switch k {
		case "lines":
			s.lines, err = strconv.Atoi(v)
		case "rate":
			s.rate, err = strconv.ParseFloat(v, 64)
		case "burst":
			s.burst, err = strconv.Atoi(v)
		case "bigline":
			s.bigLines, err = strconv.Atoi(v)
		case "bigsize":
			s.bigSize, err = strconv.Atoi(v)
		case "exit":
			s.exit, err = strconv.Atoi(v)
		case "probe":
			s.probe = v == "1"
		case "pad":
			s.pad, err = strconv.Atoi(v)
		case "failonce":
			s.failOnce = v == "1"
		case "stamp":
			s.stamp = v == "1"
		case "result":
			s.result = v != "0"
		case "write":
			s.write = v
		case "attack":
			s.attack = v
		case "read":
			s.read = v
		case "skill":
			s.skill = v
		case "leak":
			s.leak = v
		case "connect":
			s.connect = v
		case "until":
			s.until = v
		case "gate":
			s.gate = v
		case "sleep", "wait":
			var secs float64
			secs, err = strconv.ParseFloat(v, 64)
			d := time.Duration(secs * float64(time.Second))
			if k == "sleep" {
				s.sleep = d
			} else {
				s.wait = d
			}
		}
		if err != nil {
			return s, fmt.Errorf("prompt word %q: %v", w, err)
		}
	}
	return s, nil
}

// sleepUntil waits d, or less once the file until names exists.
func sleepUntil(d time.Duration, until string) {
	deadline := time.Now().Add(d)
	for until != "" && time.Now().Before(deadline) {
		if _, err := os.Stat(until); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Until(deadline))
}

// flagValue is the value after flag in args ("" if absent).
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "--serve" {
		serve(strings.Split(os.Args[2], ","))
		return
	}
	prompt, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeagent: reading the prompt:", err)
		os.Exit(2)
	}
	s, err := parseScript(string(prompt))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeagent:", err)
		os.Exit(2)
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	emit := func(v any) {
		out.Write(mustJSON(v))
		out.WriteByte('\n')
		out.Flush()
	}
	cli := filepath.Base(os.Args[0])
	session := flagValue(os.Args[1:], "--resume")
	if session == "" {
		session = flagValue(os.Args[1:], "--session")
	}
	if session == "" {
		b := make([]byte, 8)
		rand.Read(b)
		session = "fake-" + hex.EncodeToString(b)
	}
	model := flagValue(os.Args[1:], "--model")
	if model == "" {
		model = "fake-model"
	}
	f := format(cli, session, model)

	// Sessions live in $HOME, as the real CLIs keep theirs (Claude under
	// ~/.claude): resuming one this home does not hold fails as Claude
	// does, and a session is recorded as soon as it starts (a run killed
	// mid-way can be resumed).
	sessions := filepath.Join(os.Getenv("HOME"), ".fakeagent", "sessions")
	if resumed := flagValue(os.Args[1:], "--resume") + flagValue(os.Args[1:], "--session"); resumed != "" {
		if _, err := os.Stat(filepath.Join(sessions, resumed)); err != nil {
			fmt.Fprintf(os.Stderr, "No conversation found with session ID: %s (in %s)\n", resumed, sessions)
			os.Exit(1)
		}
	}
	if err := os.MkdirAll(sessions, 0o755); err == nil {
		if fh, err := os.OpenFile(filepath.Join(sessions, session), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintf(fh, "run at %s\n", time.Now().UTC().Format(time.RFC3339))
			fh.Close()
		}
	}

	first := f.init()
	if m, ok := first.(map[string]any); ok && s.stamp {
		m["written_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	}
	emit(first)
	if s.gate != "" {
		sleepUntil(5*time.Minute, s.gate)
	}
	time.Sleep(s.wait)
	if s.probe {
		p := probe(s.write)
		p.Read, p.ReadError = readRelative(s.read, string(prompt))
		if s.skill != "" {
			p.Read, p.ReadError = readSkill(s.skill, string(prompt))
		}
		emit(map[string]any{"type": "system", "subtype": "fake_agent_probe", "probe": p})
	}
	if s.attack != "" {
		a := attack(s.attack)
		emit(map[string]any{"type": "system", "subtype": "fake_agent_attack", "attack": a})
		for f := a.Forged; len(f) > 0; f = f[min(len(f), forgedPerLine):] {
			emit(map[string]any{"type": "system", "subtype": "fake_agent_forged", "forged": f[:min(len(f), forgedPerLine)]})
		}
	}
	if s.connect != "" {
		emit(map[string]any{"type": "system", "subtype": "fake_agent_connect", "connect": connect(strings.Split(s.connect, ","))})
	}
	if s.leak != "" {
		emit(f.toolResult(s.leak + "=" + os.Getenv(s.leak)))
	}
	var interval time.Duration
	if s.rate > 0 {
		interval = time.Duration(float64(time.Second) / s.rate)
	}
	// A restarted container says so, and numbers its lines apart.
	prefix := "line"
	if s.failOnce {
		if _, err := os.Stat(failedOnceMarker); err == nil {
			prefix = "again"
		}
	}
	n := 0
	line := func() {
		n++
		text := fmt.Sprintf("%s %d", prefix, n)
		if pad := s.pad - len(mustJSON(f.text(text))) - 1; pad > 0 {
			text += " " + strings.Repeat("p", pad)
		}
		emit(f.text(text))
	}
	for i := 0; i < s.lines; i++ {
		line()
		if interval > 0 {
			time.Sleep(interval)
		}
	}
	for i := 0; i < s.burst; i++ {
		line()
	}
	if s.failOnce && prefix == "line" {
		if err := os.WriteFile(failedOnceMarker, nil, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "fakeagent:", err)
		}
		out.Flush()
		os.Exit(1)
	}
	for i := 0; i < s.bigLines; i++ {
		n++
		text := fmt.Sprintf("line %d ", n)
		overhead := len(mustJSON(f.text(text)))
		emit(f.text(text + strings.Repeat("x", max(0, s.bigSize-overhead))))
	}
	sleepUntil(s.sleep, s.until)
	if s.result {
		emit(f.result(s.exit, n))
	}
	out.Flush()
	os.Exit(s.exit)
}

// failedOnceMarker survives a container restart (/tmp is the pod's
// emptyDir) but not the pod.
const failedOnceMarker = "/tmp/fakeagent-failed-once"

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
