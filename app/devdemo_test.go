package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/demo"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// seedRecords are the seeds' log records the demo makes each process write,
// with the keys that must keep their spelling in every log format
// (docs/architecture.md, "Log keys").
var seedRecords = map[string][]string{
	"cycle started":     {"runId", "AsOf"},
	"batch selected":    {"runId", "count"},
	"promotion expired": {"runId", "PurchaseId", "TenantId", "PackageKind", "targets"},
	"cycle completed":   {"runId", "ExpiredCount", "SkippedLockedCount", "DurationMs"},
	"consumed":          {"MessageId", "PurchaseId", "Version", "Status"},
	"recomputed":        {"MessageId", "PurchaseId", "Version", "cardsAffected"},
	"skipped-post-only": {"MessageId", "PurchaseId", "Version"},
}

// TestDevDemo_EveryCardShowsItsStepsBoostInPostgreSQL plays the demo of
// promoflow dev to its end, in this process, against real PostgreSQL, and
// at each step reads every card's PromotionBoost from the catalog's tables:
// the demo waits for the step on the catalog's HTTP reads, the test checks
// what PostgreSQL holds. It runs once on the embedded kfake broker that dev
// starts without KAFKA_BROKERS, as on a terminal (text logs above the live
// table), and once on the real Kafka of the test stack with topics and a
// consumer group of its own, logging JSON; each checks the seeds' records
// and keys in its format.
func TestDevDemo_EveryCardShowsItsStepsBoostInPostgreSQL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, brokers, format string
		terminal              bool
	}{
		{"embedded kfake, on a terminal", "", logFormatAuto, true},
		{"real Kafka, JSON logs", strings.Join(kafkatest.Brokers(t), ","), logFormatJSON, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.DatabaseURL(t)
			db := pgtest.Open(t, dbURL)
			suffix := kafkatest.RandomSuffix()
			d, err := parseDev([]string{"--database-url", dbURL, "--kafka-brokers=" + tc.brokers, "--http-addr", freeAddr(t),
				"--catalog-http-addr", freeAddr(t), "--admin-addr", freeAddr(t), "--catalog-admin-addr", freeAddr(t), "--topic", "pf-demo-" + suffix, "--topic-partitions", "4",
				"--log-format", tc.format, "--log-level", "info"})
			require.NoError(t, err)
			d.Catalog.Consumer.DLQTopic, d.Catalog.Consumer.ReplayTopic = "pf-demo-dlq-"+suffix, "pf-demo-replay-"+suffix
			d.Catalog.Consumer.ConsumerGroup = "pf-demo-" + suffix

			out := &lockedBuffer{}
			steps, checked := make(chan demo.Step), make(chan struct{})
			onStep := func(ctx context.Context, s demo.Step) error {
				select {
				case steps <- s:
				case <-ctx.Done():
					return ctx.Err()
				}
				select {
				case <-checked:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan error, 1)
			go func() { stopped <- d.run(ctx, devOutput{W: out, Terminal: tc.terminal, OnStep: onStep}) }()
			t.Cleanup(func() {
				cancel()
				require.NoError(t, <-stopped, "dev stops cleanly")
				if t.Failed() {
					t.Logf("output of promoflow dev:\n%s", out)
				}
			})

			var seen []string
			giveUp := time.After(90 * time.Second)
			for done := false; !done; {
				var s demo.Step
				select {
				case s = <-steps:
				case <-time.After(100 * time.Millisecond):
					if i := strings.Index(out.String(), "demo failed"); i >= 0 {
						require.FailNow(t, "the demo failed", "steps seen: %v\n%s", seen, strings.SplitN(out.String()[i:], "\n", 2)[0])
					}
					continue
				case <-giveUp:
					require.FailNow(t, "the demo went no further", "steps seen: %v", seen)
				}
				seen = append(seen, strings.TrimSpace(s.Event.Kind+" "+s.Event.Purchase))
				requireBoosts(t, db, s)
				requirePurchase(t, db, s)
				done = s.Event.Kind == demo.EventDone
				checked <- struct{}{}
			}
			require.Equal(t, []string{"seeded", "cascaded P1", "applied P2", "cascaded P3", "ignored P4", "cancelled P3", "expired P1", "done"}, seen)
			if !tc.terminal {
				requireSeedRecords(t, tc.format, out.String())
				return
			}
			shown := ansi.ReplaceAllString(out.String(), "")
			requireSeedRecords(t, logFormatText, shown)
			require.Regexp(t, `\d\d:\d\d:\d\d  cascaded  P1  Project A \+10 reached A and its published objects A1-A3`, shown, "an event line above the table")
			table := shown[strings.LastIndex(shown, "PromotionBoost of the demo cards"):]
			require.Regexp(t, `\n    B2  Hillview flat B2 +yes +5\n`, table, "the last table drawn")
			require.Regexp(t, `\n  P1 +Project A +10  Expired\n`, table, "the last table drawn")
		})
	}
}

// ansi matches the terminal's escape sequences: colours, cursor up, erase below.
var ansi = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// requireBoosts checks every card's promotion_boost in PostgreSQL against the step's.
func requireBoosts(t *testing.T, db *sqlx.DB, s demo.Step) {
	t.Helper()
	ids := make([]uuid.UUID, 0, len(s.Cards))
	want, label := map[string]int{}, map[uuid.UUID]string{}
	for _, c := range s.Cards {
		ids, want[c.Label], label[c.ID] = append(ids, c.ID), c.Boost, c.Label
	}
	var rows []struct {
		ID    uuid.UUID `db:"id"`
		Boost int       `db:"promotion_boost"`
	}
	require.NoError(t, db.Select(&rows, `SELECT id, promotion_boost FROM catalog.project_cards WHERE id = ANY($1)
		UNION ALL SELECT id, promotion_boost FROM catalog.property_object_cards WHERE id = ANY($1)`, pq.Array(ids)))
	got := map[string]int{}
	for _, r := range rows {
		got[label[r.ID]] = r.Boost
	}
	require.Equal(t, want, got, "the cards' PromotionBoost in PostgreSQL after %s %s", s.Event.Kind, s.Event.Purchase)
}

// requirePurchase checks what the step says of its purchase in PostgreSQL.
func requirePurchase(t *testing.T, db *sqlx.DB, s demo.Step) {
	t.Helper()
	var p struct {
		Status  string    `db:"status"`
		EndsAt  time.Time `db:"ends_at"`
		Updated time.Time `db:"updated_at"`
	}
	if s.Event.PurchaseId != uuid.Nil {
		require.NoError(t, db.Get(&p, `SELECT status, ends_at, updated_at FROM promotion.promotion_purchases WHERE id = $1`, s.Event.PurchaseId))
	}
	switch s.Event.Kind {
	case demo.EventIgnored:
		var kept int
		require.NoError(t, db.Get(&kept, `SELECT count(*) FROM catalog.promotion_contributions WHERE purchase_id = $1`, s.Event.PurchaseId))
		require.Zero(t, kept, "the catalog keeps no contribution of a Post-only purchase")
	case demo.EventCancelled:
		require.Equal(t, "Cancelled", p.Status)
	case demo.EventExpired:
		require.Equal(t, "Expired", p.Status)
		late := p.Updated.Sub(p.EndsAt)
		require.True(t, late >= 0 && late < 5*time.Second, "expired %s after its EndsAt: never before it, and within dev's 5s interval", late)
	}
}

// requireSeedRecords checks that out holds each of seedRecords with its
// keys, at INFO, in format.
func requireSeedRecords(t *testing.T, format, out string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for msg, keys := range seedRecords {
		found := false
		for _, line := range lines {
			if format == logFormatJSON {
				var r map[string]any
				if json.Unmarshal([]byte(line), &r) != nil || r["msg"] != msg || r["level"] != "INFO" {
					continue
				}
				found = true
				for _, k := range keys {
					found = found && r[k] != nil
				}
			} else if strings.Contains(line, " INF "+msg+" ") {
				found = true
				for _, k := range keys {
					found = found && strings.Contains(line, " "+k+"=")
				}
			}
			if found {
				break
			}
		}
		require.True(t, found, "no %s record %q with the keys %v:\n%s", format, msg, keys, out)
	}
}
