package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// Cluster is the PostgreSQL cluster the outbox runs on, as
// promotion.outbox_cluster records it (0013_outbox_cluster.sql). Every
// outbox row stores its transaction's id plus XidShift, so that the rows a
// cluster writes after a restore sort above every row and the relay's
// position that the restore brought along: nothing is skipped, and the
// relay's order stays commit order.
type Cluster struct {
	// SystemIdentifier is the cluster's pg_control_system() identifier.
	SystemIdentifier int64 `db:"system_identifier" json:"systemIdentifier,string"`
	// XidShift is 0 on the cluster where the outbox began.
	XidShift int64 `db:"xid_shift" json:"xidShift"`
	// Rebases counts the re-bases in the database's life.
	Rebases int64 `db:"rebases" json:"rebases"`
	// PreviousSystemIdentifier is the cluster of the last re-base's origin.
	PreviousSystemIdentifier *int64 `db:"previous_system_identifier" json:"previousSystemIdentifier,omitempty,string"`
	// RebasedAt is the last re-base's time.
	RebasedAt *time.Time `db:"rebased_at" json:"rebasedAt,omitempty"`
	// ReadAt is the database's clock when the record was read.
	ReadAt time.Time `db:"read_at" json:"-"`
	// Here is the system identifier of the cluster the record was read on:
	// SystemIdentifier until the first writer or relay read there re-bases.
	Here int64 `db:"here" json:"here,string"`
}

// ReadCluster reads the outbox's cluster record as it stands, without
// re-basing it (read-only callers such as promoflow status).
func ReadCluster(ctx context.Context, db *sqlx.DB) (Cluster, error) {
	var c Cluster
	if err := db.GetContext(ctx, &c, `SELECT system_identifier, xid_shift, rebases, previous_system_identifier, rebased_at,
		now() AS read_at, (SELECT system_identifier FROM pg_control_system()) AS here FROM promotion.outbox_cluster`); err != nil {
		return Cluster{}, fmt.Errorf("read the outbox cluster: %w", err)
	}
	return c, nil
}

// ResolveCluster re-bases the outbox onto the cluster db runs on, as every
// outbox writer and relay read does first, when it is not there yet (a
// restore into another cluster), in a transaction of its own, short rather
// than inside a writer's or a relay page's; then it reads the record.
func ResolveCluster(ctx context.Context, db *sqlx.DB) (Cluster, error) {
	if _, err := db.ExecContext(ctx, `SELECT promotion.outbox_xid_shift()`); err != nil {
		return Cluster{}, fmt.Errorf("resolve the outbox cluster: %w", err)
	}
	return ReadCluster(ctx, db)
}

// ClusterWatch tells, from the records a process reads in turn, the re-bases
// that happened while the process ran.
type ClusterWatch struct {
	start time.Time // monotonic
	last  *Cluster
}

// NewClusterWatch counts the re-bases from now on (the process's start).
func NewClusterWatch() *ClusterWatch { return &ClusterWatch{start: time.Now()} }

// Rebased is how many re-bases c shows that the watch had not seen: those
// since the previous record, or, for the first, one if it re-based since the
// watch began. Ages are taken on the database's clock, so that a process
// whose clock differs still counts the re-base its own start caused.
func (w *ClusterWatch) Rebased(c Cluster) int64 {
	last := w.last
	w.last = &c
	switch {
	case last != nil:
		return max(c.Rebases-last.Rebases, 0)
	case c.RebasedAt != nil && c.ReadAt.Sub(*c.RebasedAt) <= time.Since(w.start):
		return 1
	}
	return 0
}
