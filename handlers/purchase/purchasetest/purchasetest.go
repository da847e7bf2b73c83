// Package purchasetest seeds purchases and reads the promotion outbox for tests.
package purchasetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase"
)

// SeedActive inserts n Active purchases of one tenant with the given EndsAt,
// straight into the table (no outbox event), and returns their ids.
func SeedActive(t testing.TB, db *sqlx.DB, n int, endsAt time.Time) []uuid.UUID {
	t.Helper()
	tenant := uuid.New()
	ids := make([]string, n)
	targets := make([]string, n)
	out := make([]uuid.UUID, n)
	for i := range n {
		out[i] = uuid.New()
		ids[i] = out[i].String()
		raw, _ := json.Marshal([]event.Target{{TargetKind: event.TargetProject, TargetId: uuid.New()}})
		targets[i] = string(raw)
	}
	_, err := db.Exec(`INSERT INTO promotion.promotion_purchases
		(id, tenant_id, package_kind, targets, boost_weight, status, payment_status, starts_at, ends_at, created_at, updated_at, version)
		SELECT u.id, $1, 'Top', u.targets::jsonb, 10, 'Active', 'NotRequired', $2::timestamptz - interval '1 day', $2, now(), now(), 1
		FROM unnest($3::uuid[], $4::text[]) AS u(id, targets)`,
		tenant, endsAt, pq.Array(ids), pq.Array(targets))
	require.NoError(t, err)
	return out
}

// OutboxEvents decodes every event in the outbox, in outbox order.
func OutboxEvents(t testing.TB, db *sqlx.DB) []event.PurchaseChanged {
	t.Helper()
	var out []event.PurchaseChanged
	for _, msg := range OutboxMessages(t, db) {
		ev, err := event.Parse(msg.Payload)
		require.NoError(t, err)
		out = append(out, ev)
	}
	return out
}

// OutboxMessages are the messages in the outbox as the relay publishes them,
// in outbox order.
func OutboxMessages(t testing.TB, db *sqlx.DB) []*message.Message {
	t.Helper()
	var payloads [][]byte
	require.NoError(t, db.Select(&payloads, `SELECT payload::text::bytea FROM promotion.outbox_messages ORDER BY transaction_id, "offset"`))
	var out []*message.Message
	for _, p := range payloads {
		// The forwarder's envelope around the row's message.
		var env struct {
			UUID     string            `json:"uuid"`
			Payload  []byte            `json:"payload"`
			Metadata map[string]string `json:"metadata"`
		}
		require.NoError(t, json.Unmarshal(p, &env))
		msg := message.NewMessage(env.UUID, env.Payload)
		msg.Metadata = env.Metadata
		msgs, err := outbox.Unpack(msg)
		require.NoError(t, err)
		out = append(out, msgs...)
	}
	return out
}

// State is a purchase's status and version.
type State struct {
	Status  event.Status `db:"status"`
	Version int64        `db:"version"`
}

// Statuses maps purchase id to its state.
func Statuses(t testing.TB, db *sqlx.DB) map[uuid.UUID]State {
	t.Helper()
	var rows []struct {
		ID uuid.UUID `db:"id"`
		State
	}
	require.NoError(t, db.Select(&rows, `SELECT id, status, version FROM promotion.promotion_purchases`))
	out := make(map[uuid.UUID]State, len(rows))
	for _, r := range rows {
		out[r.ID] = r.State
	}
	return out
}

// NewService is a purchase service on db whose events go to topic (empty:
// event.Topic).
func NewService(t testing.TB, db *sqlx.DB, topic string) *purchase.Service {
	t.Helper()
	svc, err := purchase.NewService(db, purchase.ServiceConfig{Topic: topic})
	require.NoError(t, err)
	return svc
}
