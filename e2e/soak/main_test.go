package main

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func lines(ns ...int) []string {
	var out []string
	for _, n := range ns {
		out = append(out, fmt.Sprintf("line %d", n))
	}
	return out
}

func TestCompareLines(t *testing.T) {
	for _, c := range []struct {
		name           string
		texts          []string
		n              int
		lost, repeated int
		disordered     bool
	}{
		{"all once, in order", lines(1, 2, 3), 3, 0, 0, false},
		{"the tail lost", lines(1, 2), 3, 1, 0, false},
		{"a line in the middle lost", lines(1, 3), 3, 1, 0, false},
		{"a line twice", lines(1, 2, 2, 3), 3, 0, 1, false},
		{"a replay of the head", lines(1, 2, 3, 1, 2, 3), 3, 0, 3, false},
		{"out of order", lines(2, 1, 3), 3, 0, 0, true},
		{"a run cut short: a gapless head", lines(1, 2, 3), -1, 0, 0, false},
		{"a run cut short: a gap", lines(1, 2, 4), -1, 1, 0, false},
		{"a run cut short before its first line", nil, -1, 0, 0, false},
		{"other texts are not lines", append(lines(1), "thinking…"), 1, 0, 0, false},
	} {
		lost, repeated, disordered := compareLines(c.texts, c.n)
		if lost != c.lost || repeated != c.repeated || disordered != c.disordered {
			t.Errorf("%s: lost %d repeated %d out of order %v; want %d %d %v", c.name, lost, repeated, disordered, c.lost, c.repeated, c.disordered)
		}
	}
}

// TestKillsOfOnePodAreSpaced: a pod killed within the spacing is not
// picked again (the kubelet's crash-loop backoff would be measured), one
// killed longer ago and one never killed are.
func TestKillsOfOnePodAreSpaced(t *testing.T) {
	now := time.Now()
	killedAt := map[string]time.Time{"relay-a": now.Add(-time.Minute), "relay-b": now.Add(-10 * time.Minute)}
	got := rested([]string{"relay-a", "relay-b", "relay-c"}, killedAt, now, 5*time.Minute)
	if !slices.Equal(got, []string{"relay-b", "relay-c"}) {
		t.Errorf("rested %v, want relay-b (killed 10 min ago) and relay-c (never)", got)
	}
	if got := rested([]string{"relay-a"}, killedAt, now, 0); !slices.Equal(got, []string{"relay-a"}) {
		t.Errorf("no spacing: rested %v, want relay-a", got)
	}
}

// TestPaperclipsKillsAreSpacedLonger: the Paperclip server's pod waits
// out its own spacing (its agents' runs wait for Paperclip's lost-run
// check after each kill), never less than every pod's; the other
// targets keep the common one.
func TestPaperclipsKillsAreSpacedLonger(t *testing.T) {
	k := &killer{spacing: 5 * time.Minute, paperclipSpacing: 12 * time.Minute}
	if got := k.spacingOf("Paperclip"); got != 12*time.Minute {
		t.Errorf("Paperclip's spacing %s, want 12m", got)
	}
	for _, target := range []string{"webhook", "claim controller", "relay"} {
		if got := k.spacingOf(target); got != 5*time.Minute {
			t.Errorf("%s's spacing %s, want the common 5m", target, got)
		}
	}
	k.spacing = 20 * time.Minute
	if got := k.spacingOf("Paperclip"); got != 20*time.Minute {
		t.Errorf("a common spacing above Paperclip's: Paperclip's %s, want 20m", got)
	}
}

// TestTheWebhookTargetSparesTheClaimLeader: a kill aimed at the webhook
// strikes the replica that does not lead the claim controller, so the
// claim controller's own kills are not held back by the webhook's
// spacing; a lone ready replica is struck all the same.
func TestTheWebhookTargetSparesTheClaimLeader(t *testing.T) {
	live := []string{"webhook-a", "webhook-b"}
	if got := besidesLeader(live, "webhook-a"); !slices.Equal(got, []string{"webhook-b"}) {
		t.Errorf("besidesLeader %v, want webhook-b", got)
	}
	if !slices.Equal(live, []string{"webhook-a", "webhook-b"}) {
		t.Errorf("besidesLeader changed its input: %v", live)
	}
	if got := besidesLeader([]string{"webhook-a"}, "webhook-a"); !slices.Equal(got, []string{"webhook-a"}) {
		t.Errorf("the leader alone: %v, want it struck all the same", got)
	}
	if got := besidesLeader(live, ""); !slices.Equal(got, live) {
		t.Errorf("no leader known: %v, want both", got)
	}
}
