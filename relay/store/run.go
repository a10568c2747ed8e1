package store

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"

	"github.com/paperclipai/clipjob/relay/result"
)

// Run is what the relay knows of one agent run.
type Run struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Job       string `json:"job,omitempty"`
	// JobUID is the Job that controls the run's pods. A run is bound to
	// its namespace and this Job when first seen: a pod of another Job or
	// namespace that copies the run id is not part of it.
	JobUID string `json:"jobUid,omitempty"`
	Pod    string `json:"pod,omitempty"`
	PodUID string `json:"podUid,omitempty"`
	// PodCreated orders the pods of a run a Job retried: the record
	// describes the newest.
	PodCreated *time.Time `json:"podCreated,omitempty"`
	Agent      string     `json:"agent,omitempty"`
	Company    string     `json:"company,omitempty"`
	Task       string     `json:"task,omitempty"`
	Session    string     `json:"session,omitempty"`
	Adapter    string     `json:"adapter,omitempty"`
	Containers []string   `json:"containers,omitempty"`
	// MainContainer is the agent's (first app) container.
	MainContainer string `json:"mainContainer,omitempty"`
	// Phase is the pod's: Pending, Running, Succeeded, Failed, or Unknown
	// (the pod vanished before it was seen to end).
	Phase      string     `json:"phase"`
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// ExitCode and Reason are the agent (first) container's termination.
	ExitCode *int32 `json:"exitCode,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Done: the run ended and every stream was drained; its log is final.
	Done    bool           `json:"done"`
	LastSeq uint64         `json:"lastSeq"`
	Bytes   int64          `json:"bytes"`
	Result  *result.Result `json:"result,omitempty"`
	// SeenAt is when the relay last stored anything for the run.
	SeenAt time.Time `json:"seenAt"`
}

// Line is one stored log line.
type Line struct {
	Seq       uint64    `json:"seq"`
	TS        time.Time `json:"ts"`
	Container string    `json:"container"`
	Line      string    `json:"line"`
}

// AppendJSON appends the line's JSON to b, byte for byte json.Marshal's,
// without its reflection over the Line, its time's allocation and its
// copy of the result: the stores write every line. The strings are
// quoted by encoding/json itself.
func (l *Line) AppendJSON(b []byte) ([]byte, error) {
	b = strconv.AppendUint(append(b, `{"seq":`...), l.Seq, 10)
	b, err := l.TS.AppendText(append(b, `,"ts":"`...))
	if err != nil {
		return nil, fmt.Errorf("line %d: %w", l.Seq, err)
	}
	w := bytes.NewBuffer(append(b, `","container":`...))
	enc := json.NewEncoder(w) // each value ends with a newline, dropped
	for _, f := range [...]struct{ v, next string }{{l.Container, `,"line":`}, {l.Line, "}"}} {
		_ = enc.Encode(f.v)
		w.Truncate(w.Len() - 1)
		w.WriteString(f.next)
	}
	return w.Bytes(), nil
}

// RunKey is where the run of Job jobUID is kept when another Job took its
// run id first. "@" is in no label value and no UID, so no two keys are
// alike. jobUID must be a UID (ValidJobUID): the API server does not check
// an owner reference's, and the key names a mirror file.
func RunKey(run, jobUID string) string { return run + "@" + jobUID }

var uidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ValidJobUID says whether uid has the shape of the UIDs the API server
// gives objects.
func ValidJobUID(uid string) bool { return uidPattern.MatchString(uid) }

// PageBytes bounds the text one Lines call returns (at least one line).
const PageBytes = 4 << 20

// MaxSeq bounds sequence numbers: no line's is at or above it (PostgreSQL
// keeps them in a bigint), so nothing is after a cursor there.
const MaxSeq = math.MaxInt64

// Lines is b's Page, decoded.
func Lines(b Backend, run string, after uint64, limit int) ([]Line, error) {
	var out []Line
	var bad error
	_, _, _, err := b.Page(run, after, limit, func(r RawLine) {
		var l Line
		if err := json.Unmarshal(r.JSON, &l); err != nil && bad == nil {
			bad = fmt.Errorf("line %d: %w", r.Seq, err)
		}
		out = append(out, l)
	})
	if err = cmp.Or(err, bad); err != nil {
		return nil, err
	}
	return out, nil
}

// EachLine hands fn the lines of run after sequence after, in order, a
// page at a time, until fn returns false or an error, or the lines end.
func EachLine(b Backend, run string, after uint64, fn func(Line) (bool, error)) error {
	for {
		lines, err := Lines(b, run, after, 1000)
		if err != nil || len(lines) == 0 {
			return err
		}
		for _, l := range lines {
			if more, err := fn(l); !more || err != nil {
				return err
			}
			after = l.Seq
		}
	}
}

// RawLine is a stored line as the store keeps it: the JSON of a Line.
type RawLine struct {
	Seq  uint64
	JSON []byte
}

// Summary is the part of a run's record lists and retention read.
type Summary struct {
	ID        string    `json:"id"`
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod,omitempty"`
	PodUID    string    `json:"podUid,omitempty"`
	Agent     string    `json:"agent,omitempty"`
	Company   string    `json:"company,omitempty"`
	Phase     string    `json:"phase"`
	Done      bool      `json:"done"`
	LastSeq   uint64    `json:"lastSeq"`
	Bytes     int64     `json:"bytes"`
	SeenAt    time.Time `json:"seenAt"`
}

// Summary is the part of r lists and retention read.
func (r *Run) Summary() Summary {
	return Summary{ID: r.ID, Namespace: r.Namespace, Pod: r.Pod, PodUID: r.PodUID, Agent: r.Agent, Company: r.Company,
		Phase: r.Phase, Done: r.Done, LastSeq: r.LastSeq, Bytes: r.Bytes, SeenAt: r.SeenAt}
}

// Run is the summary as a Run record with only those fields set.
func (s Summary) Run() Run {
	return Run{ID: s.ID, Namespace: s.Namespace, Pod: s.Pod, PodUID: s.PodUID, Agent: s.Agent, Company: s.Company, Phase: s.Phase,
		Done: s.Done, LastSeq: s.LastSeq, Bytes: s.Bytes, SeenAt: s.SeenAt}
}

// Retired is what is kept of a run retention deleted while its pods may
// remain, so that no relay collects those pods again and rewrites what
// retention removed. It is keyed by the run's namespace and Job (a pod
// names its controller itself, so one elsewhere may claim another
// namespace's Job UID), and forgotten once no pod of that Job remains.
type Retired struct {
	JobUID string `json:"jobUid"`
	// Namespace is the Job's (its pods'): a relay watching other
	// namespaces cannot tell whether its pods remain.
	Namespace string `json:"namespace"`
	// Run is the retired run's key, for logs and operators.
	Run string `json:"run"`
	// PodCreated is the run's newest pod's creation: a pod of the Job
	// created later is a new attempt of the run, and is collected.
	PodCreated time.Time `json:"podCreated"`
	RetiredAt  time.Time `json:"retiredAt"`
}

// Covers says whether a pod of the Job created at created is one of the
// retired run's pods.
func (r *Retired) Covers(created time.Time) bool {
	return r != nil && !created.After(r.PodCreated)
}

// RetiredOf returns what retention keeps of run r, retired at now: nil
// when the record names no Job (a record from before runs were bound to
// one), whose pods then cannot be told apart.
func RetiredOf(r *Run, now time.Time) *Retired {
	if r == nil || !ValidJobUID(r.JobUID) {
		return nil
	}
	t := &Retired{JobUID: r.JobUID, Namespace: r.Namespace, Run: r.ID, RetiredAt: now}
	if r.PodCreated != nil {
		t.PodCreated = *r.PodCreated
	}
	return t
}

// MirrorState is how much of a run's log its NDJSON mirror file holds: up
// to sequence Seq, Size bytes. It is committed after the file is written,
// so a crash between the two is found (the file is longer) and repaired.
type MirrorState struct {
	Seq  uint64 `json:"seq"`
	Size int64  `json:"size"`
	// Inode of the file written: another file swapped in under the name
	// is rebuilt from the store, whatever its size.
	Inode uint64 `json:"inode,omitempty"`
	// Done: the run ended and its file and done marker were written; the
	// mirror never touches them again, so a reader may remove them.
	Done bool `json:"done,omitempty"`
}
