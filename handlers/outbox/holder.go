package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// RelaySession is a database session of a relay in a position transaction:
// the one that holds the outbox position now, or one that runs the
// position's read (waiting on its row lock, or about to take it). A relay
// holds the position only while it reads and publishes a page: an idle one's
// read lasts milliseconds a poll, and its session shows none between them.
type RelaySession struct {
	PID         int    `db:"pid" json:"pid"`
	Application string `db:"application_name" json:"application"`
	// Client is the address the session comes from (a pooler's when one
	// sits between), "local" for a Unix socket.
	Client string `db:"client" json:"client"`
	State  string `db:"state" json:"state"`
	// Holder is set for the session whose transaction is the position's last
	// holder (promotion.outbox_relay_holder) and still runs.
	Holder bool `db:"holder" json:"holder"`
	// Waiting is set while it waits on the position's row lock.
	Waiting bool `db:"waiting" json:"waiting"`
	// Since is how long its transaction has run, or, outside one, since its
	// last statement ended.
	Since time.Duration `db:"-" json:"-"`
}

// RelaySessions lists the relay's sessions in this database, the holder
// first. The last holder's transaction id is the sequence's value (64-bit;
// pg_stat_activity gives 32 bits). It names sessions, never their statements:
// a running read is recognised by the position function it calls.
func RelaySessions(ctx context.Context, db *sqlx.DB) ([]RelaySession, error) {
	var rows []struct {
		RelaySession
		SinceSecs float64 `db:"since_seconds"`
	}
	err := db.SelectContext(ctx, &rows, `WITH h AS (SELECT last_value % 4294967296 AS xid FROM promotion.outbox_relay_holder)
		SELECT a.pid, coalesce(a.application_name, '') AS application_name,
			coalesce(host(a.client_addr), 'local') AS client, coalesce(a.state, '') AS state,
			coalesce(a.backend_xid::text::bigint = h.xid, false) AS holder,
			coalesce(a.wait_event_type = 'Lock', false) AS waiting,
			EXTRACT(EPOCH FROM clock_timestamp() - coalesce(a.xact_start, a.state_change))::float8 AS since_seconds
		FROM pg_stat_activity a, h
		WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
			AND (a.backend_xid::text::bigint = h.xid OR a.query LIKE '%promotion.outbox_relay_position(%')
		ORDER BY holder DESC, waiting DESC, a.pid`)
	if err != nil {
		return nil, fmt.Errorf("read the relay's sessions: %w", err)
	}
	out := make([]RelaySession, len(rows))
	for i, r := range rows {
		out[i] = r.RelaySession
		out[i].Since = time.Duration(r.SinceSecs * float64(time.Second))
	}
	return out, nil
}
