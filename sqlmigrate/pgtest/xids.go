package pgtest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// XidHold is a transaction seen holding a transaction id (an xid): every
// promotion relay of the server waits for the oldest one.
type XidHold struct {
	Pid int
	Xid string
	// Age is the transaction's age (since xact_start) when last seen.
	Age time.Duration
	// State and Query are pg_stat_activity's when last seen; Label is what
	// the test's label said then.
	State, Query, Label string
}

func (h XidHold) String() string {
	during := ""
	if h.Label != "" {
		during = ", during " + h.Label
	}
	return fmt.Sprintf("pid %d xid %s held for %s (%s%s): %s", h.Pid, h.Xid, h.Age.Round(time.Millisecond),
		h.State, during, h.Query)
}

// WatchXids samples pg_stat_activity on db every 20 ms for the transactions
// of the sessions named application that hold an xid, until the returned
// stop, which returns each transaction seen, with the longest it was seen
// holding its xid. label, when set, names what the tool under test is doing
// at each sample.
func WatchXids(t testing.TB, db *sqlx.DB, application string, label func() string) (stop func() []XidHold) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	held := map[string]XidHold{}
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			var rows []struct {
				Pid   int     `db:"pid"`
				Xid   string  `db:"xid"`
				Age   float64 `db:"age"`
				State string  `db:"state"`
				Query string  `db:"query"`
			}
			if err := db.Select(&rows, `SELECT pid, backend_xid::text AS xid, extract(epoch FROM now() - xact_start) AS age,
					coalesce(state, '') AS state, left(query, 100) AS query
				FROM pg_stat_activity WHERE application_name = $1 AND backend_xid IS NOT NULL`, application); err != nil {
				t.Errorf("watch transactions: %v", err)
				return
			}
			what := ""
			if label != nil {
				what = label()
			}
			for _, r := range rows {
				h := XidHold{Pid: r.Pid, Xid: r.Xid, Age: time.Duration(r.Age * float64(time.Second)), State: r.State,
					Query: r.Query, Label: what}
				if h.Age >= held[h.Xid].Age {
					held[h.Xid] = h
				}
			}
		}
	})
	var once sync.Once
	var out []XidHold
	return func() []XidHold {
		once.Do(func() {
			close(done)
			wg.Wait()
			for _, h := range held {
				out = append(out, h)
			}
		})
		return out
	}
}

// RequireXidsHeldAtMost checks that seen (of WatchXids) holds a transaction
// and none that held its xid longer than most; a failure lists each of them.
// It returns the one that held its xid longest.
func RequireXidsHeldAtMost(t testing.TB, seen []XidHold, most time.Duration, what string) XidHold {
	t.Helper()
	require.NotEmpty(t, seen, "the watch saw no transaction of %s", what)
	var long []string
	var longest XidHold
	for _, h := range seen {
		if h.Age > most {
			long = append(long, h.String())
		}
		if h.Age > longest.Age {
			longest = h
		}
	}
	require.Empty(t, long, "transactions of %s held an xid for longer than %s:\n\t%s", what, most, strings.Join(long, "\n\t"))
	return longest
}
