package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Demo credentials of the dev command, printed at start.
const (
	devAPIToken   = "demo-token"
	devTenant     = "00000000-0000-4000-8000-000000000001"
	devAdminToken = "demo-admin-token"
)

// runDev runs both contexts in one process for a laptop: the promotion API on
// :8080 and the catalog on :8081. Without KAFKA_BROKERS it starts an embedded
// in-process Kafka-protocol broker (kfake) on 127.0.0.1; it needs DATABASE_URL
// (scripts/run.sh starts a private PostgreSQL when none is given).
func runDev(ctx context.Context, args []string) error {
	var p promotionConfig
	var c catalogConfig
	ps := newSettings("dev", "Runs the promotion and catalog contexts in one process, with an embedded Kafka broker when $KAFKA_BROKERS is empty.\n"+
		"Every setting of \"promotion\" and \"catalog\" is read from the environment.")
	p.register(ps)
	if err := ps.parse(args); err != nil {
		return err
	}
	cs := newSettings("catalog", "")
	c.register(cs)
	if err := cs.parse(nil); err != nil {
		return err
	}
	if p.DatabaseURL == "" {
		return errors.New("database URL is required ($DATABASE_URL); scripts/run.sh starts a local PostgreSQL")
	}
	c.DatabaseURL = p.DatabaseURL
	c.DatabaseDirectURL = p.DatabaseDirectURL
	// The banner shows a demo token dev makes up, never a token the operator
	// set: it goes to terminals and logs. It names where that one comes from.
	apiToken, adminToken := "<a token of PROMOTION_API_TOKENS>", "$CATALOG_ADMIN_TOKEN"
	if p.APITokens == "" {
		p.APITokens = devAPIToken + "=" + devTenant
		apiToken = devAPIToken
	}
	if c.AdminToken == "" {
		c.AdminToken = devAdminToken
		adminToken = devAdminToken
	}
	if _, ok := os.LookupEnv("EXPIRE_INTERVAL"); !ok && !flagGiven(ps, "expire-interval") {
		p.Expire.Interval = 5 * time.Second // a laptop demo: expiry shows within seconds
	}
	if _, ok := os.LookupEnv("HTTP_ADDR"); !ok && !flagGiven(ps, "http-addr") {
		p.HTTPAddr, c.HTTPAddr = "127.0.0.1:8080", "127.0.0.1:8081"
	}
	log := p.logger("dev")

	if p.Kafka.Brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(p.Topics.Partitions))
		if err != nil {
			return fmt.Errorf("embedded kafka: %w", err)
		}
		defer cluster.Close()
		p.Kafka.Brokers = cluster.ListenAddrs()[0]
		log.Info("embedded kafka broker started (in memory; state is lost at exit)", "addr", p.Kafka.Brokers)
	}
	c.Kafka = p.Kafka
	if err := errors.Join(p.validate(), c.commonConfig.validate(), c.Topics.validate()); err != nil {
		return err
	}
	// Double quotes: pasted into a shell, "$CATALOG_ADMIN_TOKEN" is the operator's token.
	fmt.Fprintf(os.Stderr, `promoflow dev
  purchase API  http://%s   (Authorization: Bearer %s)
  catalog       http://%s   (admin: Bearer %s)
  kafka         %s
  try: curl -s -XPUT -H "Authorization: Bearer %s" http://%s/cards/projects/11111111-1111-4111-8111-111111111111 -d '{"Title":"Demo"}'
       curl -s -XPOST -H "Authorization: Bearer %s" http://%s/promotions -d '{"PackageKind":"Top","BoostWeight":10,"EndsAt":"2030-01-01T00:00:00Z","Targets":[{"TargetKind":"Project","TargetId":"11111111-1111-4111-8111-111111111111"}]}'
       curl -s http://%s/cards/projects/11111111-1111-4111-8111-111111111111
`, p.HTTPAddr, apiToken, c.HTTPAddr, adminToken, p.Kafka.Brokers,
		adminToken, c.HTTPAddr, apiToken, p.HTTPAddr, c.HTTPAddr)

	return runAll(ctx, log,
		func(ctx context.Context) error { return startPromotion(ctx, p, p.logger("promotion")) },
		func(ctx context.Context) error { return startCatalog(ctx, c, c.logger("catalog")) },
	)
}
