package boost

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/sqlmigrate"
	"os"
	"github.com/promoflow/promoflow/handlers/event"
)

func TestZZProf(t *testing.T) {
	admin := sqlx.MustOpen("postgres", os.Getenv("DATABASE_URL"))
	admin.MustExec("DROP DATABASE IF EXISTS pf_scratch_prof")
	admin.MustExec("CREATE DATABASE pf_scratch_prof")
	defer admin.Exec("DROP DATABASE pf_scratch_prof WITH (FORCE)")
	db := sqlx.MustOpen("postgres", "postgres://postgres@127.0.0.1:55432/pf_scratch_prof?sslmode=disable")
	defer db.Close()
	if _, err := sqlmigrate.Up(context.Background(), db.DB); err != nil { t.Fatal(err) }
	ctx := context.Background()
	var ps []uuid.UUID
	var objs []uuid.UUID
	tx := db.MustBegin()
	for range 50 {
		p := uuid.New()
		ps = append(ps, p)
		if err := UpsertProjectCardTx(ctx, tx, ProjectCard{ID: p, Status: "s", Visibility: "v"}); err != nil {
			t.Fatal(err)
		}
		for range 20 {
			o := uuid.New()
			objs = append(objs, o)
			if err := UpsertPropertyObjectCardTx(ctx, tx, PropertyObjectCard{ID: o, ProjectID: p, Published: true, Status: "s"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tx.Commit()
	var d [5]time.Duration
	for i := range 500 {
		p, o := ps[i%50], objs[(i*7)%1000]
		ev := event.PurchaseChanged{PurchaseId: uuid.New(), BoostWeight: 5, Status: event.StatusActive, Version: 1, EndsAt: time.Now(),
			Targets: []event.Target{{TargetKind: event.TargetProject, TargetId: p}, {TargetKind: event.TargetPropertyObject, TargetId: o}}}
		tx := db.MustBeginTx(ctx, nil)
		projects, objects := splitTargets(ev.Targets)
		s := time.Now()
		must(t, lock(ctx, tx, []string{ev.PurchaseId.String()}, projects, nil, nil))
		d[0] += time.Since(s); s = time.Now()
		must(t, lock(ctx, tx, nil, nil, objects, projects))
		d[1] += time.Since(s); s = time.Now()
		_, err := upsertContributions(ctx, tx, ev, projects, objects)
		must(t, err)
		d[2] += time.Since(s); s = time.Now()
		_, err = recompute(ctx, tx, projects, objects)
		must(t, err)
		d[3] += time.Since(s); s = time.Now()
		must(t, tx.Commit())
		d[4] += time.Since(s)
	}
	for i := range d {
		t.Logf("step %d: %v/op", i, d[i]/500)
	}
	tx3 := db.MustBegin()
	st := time.Now()
	for range 500 { tx3.MustExec(`SELECT $1::int`, 1) }
	t.Logf("select $1: %v", time.Since(st)/500)
	st = time.Now()
	for range 500 { must(t, lock(ctx, tx3, []string{uuid.NewString()}, []string{ps[1].String()}, nil, nil)) }
	t.Logf("lock purchase+project: %v", time.Since(st)/500)
	st = time.Now()
	for range 500 { tx3.MustExec(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, uuid.NewString()) }
	t.Logf("lock one simple: %v", time.Since(st)/500)
	st = time.Now()
	for range 500 { tx3.MustExec(`SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) k`, pq.Array([]int64{1,2})) }
	t.Logf("lock array simple: %v", time.Since(st)/500)
	const alt = `SELECT pg_advisory_xact_lock(k) FROM (
  SELECT g, hashtextextended(s, 0) AS k FROM unnest($1::int[], $2::text[]) AS u(g, s)
  UNION ALL
  SELECT 2, hashtextextended('catalog:card:PropertyObject:' || id::text, 0)
  FROM catalog.property_object_cards WHERE published AND project_id = ANY($3::uuid[])
) keys ORDER BY g, k`
	st = time.Now()
	for range 500 { tx3.MustExec(alt, pq.Array([]int{0,1}), pq.Array([]string{"catalog:purchase:"+uuid.NewString(), "catalog:card:Project:"+ps[1].String()}), pq.Array([]string(nil))) }
	t.Logf("alt lock purchase+project: %v", time.Since(st)/500)
	st = time.Now()
	for range 500 { tx3.MustExec(alt, pq.Array([]int{2}), pq.Array([]string{"catalog:card:PropertyObject:"+uuid.NewString()}), pq.Array([]string{ps[1].String()})) }
	t.Logf("alt lock cascade: %v", time.Since(st)/500)
	st = time.Now()
	for range 500 { must(t, lock(ctx, tx3, nil, nil, []string{uuid.NewString()}, []string{ps[1].String()})) }
	t.Logf("cur lock cascade: %v", time.Since(st)/500)
	st = time.Now()
	for range 500 { tx3.MustExec(`SELECT pg_advisory_xact_lock(k) FROM (SELECT g, hashtextextended(s, 0) AS k FROM unnest($1::int[], $2::text[]) AS u(g, s)) x ORDER BY g, k`, pq.Array([]int{0,1}), pq.Array([]string{"catalog:purchase:"+uuid.NewString(), "catalog:card:Project:"+ps[1].String()})) }
	t.Logf("alt lock no table: %v", time.Since(st)/500)
	tx3.Rollback()
	{
	rows, err := db.Queryx(`EXPLAIN VERBOSE `+lockSQL, pq.Array([]int{0}), pq.Array([]string{"x"}), pq.Array([]string{ps[0].String()}))
	must(t, err)
	for rows.Next() { var l string; rows.Scan(&l); t.Log("LOCK ", l) }
	}
	tx2 := db.MustBegin()
	defer tx2.Rollback()
	tx2.MustExec(`UPDATE catalog.project_cards SET promotion_boost = promotion_boost + 1`)
	tx2.MustExec(`UPDATE catalog.property_object_cards SET promotion_boost = promotion_boost + 1`)
	rows, err := tx2.Queryx(`EXPLAIN (ANALYZE, BUFFERS) `+recomputeSQL, pq.Array([]string{ps[0].String()}), pq.Array([]string{objs[3].String()}))
	must(t, err)
	for rows.Next() { var l string; rows.Scan(&l); t.Log(l) }
	var _ *sqlx.DB
}

func must(t *testing.T, err error) { if err != nil { t.Fatal(err) } }
