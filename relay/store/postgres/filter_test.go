package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/paperclipai/clipjob/relay/store"
	"github.com/paperclipai/clipjob/relay/store/postgres"
	"github.com/paperclipai/clipjob/relay/store/postgres/pgtest"
)

// TestRunsWhereReadsByIndex: the runs of one agent, of one company, and
// the unfinished ones can be read through their indexes (migrations 0002
// and 0006),
// not by reading every run, so a relay with many stored runs answers an
// adapter's "my agent's running run" without scanning them all.
func TestRunsWhereReadsByIndex(t *testing.T) {
	conn, schema := pgtest.Schema(t)
	s := open(t, postgres.Options{ConnString: conn, Schema: schema})
	for i := range 300 {
		if _, err := s.UpdateRun(fmt.Sprintf("run-%d", i), func(r *store.Run) {
			r.Agent, r.Company, r.Phase, r.Done = fmt.Sprintf("agent-%d", i%50), fmt.Sprintf("co-%d", i%60), "Succeeded", i%10 != 0
		}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.RunsWhere(store.Filter{Agent: "agent-3"}); err != nil || len(got) != 6 {
		t.Fatalf("agent-3: %d runs (%v), want 6", len(got), err)
	}
	c := connect(t, conn)
	exec(t, c, "ANALYZE "+pgx.Identifier{schema}.Sanitize()+".runs")
	// At 300 runs a scan of them all can be as cheap as an index: what is
	// checked is that each query can be read through its index (the shape
	// of the query matches it), as it is once runs are many.
	exec(t, c, "SET enable_seqscan = off")
	for where, index := range map[string]string{"agent = 'agent-3'": "runs_agent", "company = 'co-2'": "runs_company",
		"NOT done": "runs_unfinished"} {
		var plan strings.Builder
		rows, err := c.Query(context.Background(), "EXPLAIN SELECT id FROM "+pgx.Identifier{schema}.Sanitize()+".runs WHERE "+where+" ORDER BY seen_at DESC")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		rows.Close()
		if !strings.Contains(plan.String(), index) {
			t.Errorf("WHERE %s is not read through %s:\n%s", where, index, plan.String())
		}
	}
}
