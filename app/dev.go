package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/promoflow/promoflow/app/demo"
)

// Demo credentials of the dev command, printed at start.
const (
	devAPIToken   = "demo-token"
	devTenant     = "00000000-0000-4000-8000-000000000001"
	devAdminToken = "demo-admin-token"
)

// devConfig is what promoflow dev runs: both contexts in one process, and the demo.
type devConfig struct {
	Promotion promotionConfig
	Catalog   catalogConfig
	// Demo seeds a small catalog and makes one purchase per target kind once
	// both contexts are ready. Defaults to true.
	Demo bool
	// AllowRemote lets dev listen beyond loopback, with the operator's tokens
	// only. Defaults to false.
	AllowRemote bool
	// The banner shows a demo token dev made up, never a token the operator
	// set: it goes to terminals and logs. It names where that one comes from.
	apiTokenShown, adminTokenShown string
	// memoryLimit is what the ready record says of the process's memory
	// limit: dev logs nothing else before it.
	memoryLimit []any
}

// devOutput is where dev writes, and who else watches the demo.
type devOutput struct {
	W io.Writer
	// Terminal says whether W is a terminal: the log format of auto follows
	// it, and the demo draws its live table there.
	Terminal bool
	// OnStep is called after each step of the demo (demo.Config.OnStep).
	OnStep func(context.Context, demo.Step) error
}

// runDev runs both contexts in one process for a laptop: the promotion API on
// 127.0.0.1:8080 and the catalog on 127.0.0.1:8081. Without KAFKA_BROKERS it
// starts an embedded in-process Kafka-protocol broker (kfake) on 127.0.0.1;
// it needs DATABASE_URL (scripts/run.sh starts a private PostgreSQL when none
// is given).
func runDev(ctx context.Context, args []string) error {
	d, err := parseDev(args)
	if err != nil {
		return err
	}
	terminal := stderrIsTerminal()
	d.memoryLimit = applyMemoryLimit(0, slog.New(d.Promotion.handler(os.Stderr, terminal)).With("service", "dev"))
	return d.run(ctx, devOutput{W: os.Stderr, Terminal: terminal})
}

// parseDev reads dev's settings: those of promotion (flags and environment),
// the catalog's own from the environment, and what both share from the
// promotion's: the database, Kafka, the logs, the topic and how topics are made.
func parseDev(args []string) (devConfig, error) {
	d := devConfig{apiTokenShown: "<a token of PROMOTION_API_TOKENS>", adminTokenShown: "$CATALOG_ADMIN_TOKEN"}
	p, c := &d.Promotion, &d.Catalog
	cs := newSettings("catalog", "")
	c.register(cs)
	if err := cs.parse(nil); err != nil {
		return d, err
	}
	ps := newSettings("dev", "Runs the promotion and catalog contexts in one process, with an embedded Kafka broker when $KAFKA_BROKERS is empty,\n"+
		"then plays a live demo: a small catalog, one purchase per target kind, the cards' boosts as they change.\n"+
		"Every setting of \"promotion\" and \"catalog\" is read from the environment.")
	p.register(ps)
	defaultMigrateOnStart(ps, &p.commonConfig)
	var catalogAddr, catalogAdminAddr string
	ps.str(&catalogAddr, "catalog-http-addr", "DEV_CATALOG_HTTP_ADDR", "127.0.0.1:8081", "listen address of the catalog's public listener: its API, /healthz and /readyz (--http-addr is the promotion's)")
	ps.str(&catalogAdminAddr, "catalog-admin-addr", "DEV_CATALOG_ADMIN_ADDR", "127.0.0.1:9081", "listen address of the catalog's internal listener: /metrics, /admin/* and the detailed /readyz (--admin-addr is the promotion's)")
	ps.bool(&d.Demo, "demo", "PROMOFLOW_DEMO", true, "seed a small catalog, make one purchase per target kind and show the cards' boosts as they change (a live table on a terminal)")
	ps.negation("no-demo", "demo", "skip the demo: --demo=false")
	ps.bool(&d.AllowRemote, "allow-remote", "DEV_ALLOW_REMOTE", false, "listen on an address other than loopback; then $PROMOTION_API_TOKENS and $CATALOG_ADMIN_TOKEN are required, and the demo tokens refused")
	if err := ps.parse(args); err != nil {
		return d, err
	}
	if p.DatabaseURL == "" {
		return d, errors.New("database URL is required ($DATABASE_URL); scripts/run.sh starts a local PostgreSQL")
	}
	if _, ok := os.LookupEnv("HTTP_ADDR"); !ok && !flagGiven(ps, "http-addr") {
		p.HTTPAddr = "127.0.0.1:8080"
	}
	p.dev = true
	if err := errors.Join(resolveSecrets(c.secrets...), p.apiTokens.resolve()); err != nil {
		return d, err
	}
	c.commonConfig, c.HTTPAddr, c.AdminAddr = p.commonConfig, catalogAddr, catalogAdminAddr
	c.Consumer.Topic, c.Topics = p.Topic, p.Topics
	if err := checkDevExposure(d.AllowRemote, p.APITokens, c.AdminToken,
		map[string]string{"the purchase API": p.HTTPAddr, "the catalog": c.HTTPAddr,
			"the promotion's internal listener": p.AdminAddr, "the catalog's internal listener": c.AdminAddr}); err != nil {
		return d, err
	}
	if p.APITokens == "" {
		p.APITokens = devAPIToken + "=" + devTenant
		d.apiTokenShown = devAPIToken
	}
	if c.AdminToken == "" {
		c.AdminToken = devAdminToken
		d.adminTokenShown = devAdminToken
	}
	if c.FeedToken == "" {
		c.FeedToken = c.AdminToken // one demo token for the feed and /admin on a laptop
	}
	if _, ok := os.LookupEnv("EXPIRE_INTERVAL"); !ok && !flagGiven(ps, "expire-interval") {
		p.Expire.Interval = 5 * time.Second // a laptop demo: expiry shows within seconds
	}
	return d, nil
}

func (d devConfig) run(ctx context.Context, out devOutput) error {
	p, c := d.Promotion, d.Catalog
	w := out.W
	var screen *demo.Screen
	if d.Demo && out.Terminal {
		screen = demo.NewScreen(out.W, stderrWidth()) // the live table below what is logged
		w = screen
	}
	log := slog.New(p.handler(w, out.Terminal)).With("service", "dev")
	quiet := &quietLogs{stop: ctx}
	quietLogger := func(service string) *slog.Logger {
		return slog.New(quiet.wrap(p.handler(w, out.Terminal))).With("service", service)
	}

	embedded := ""
	if p.Kafka.Brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(p.Topics.Partitions))
		if err != nil {
			return fmt.Errorf("embedded kafka: %w", err)
		}
		defer cluster.Close()
		p.Kafka.Brokers, embedded = cluster.ListenAddrs()[0], " (embedded, in memory: its state is lost at exit)"
		c.Kafka = p.Kafka
	}
	if err := errors.Join(p.validate(), c.commonConfig.validate(), c.Topics.validate()); err != nil {
		return err
	}
	// Double quotes: pasted into a shell, "$CATALOG_ADMIN_TOKEN" is the operator's token.
	fmt.Fprintf(w, `promoflow dev
  purchase API  http://%s   (Authorization: Bearer %s)
  catalog       http://%s   (admin: Bearer %s)
  kafka         %s%s
  try: curl -s -XPUT -H "Authorization: Bearer %s" http://%s/cards/projects/11111111-1111-4111-8111-111111111111 -d '{"Title":"Demo"}'
       curl -s -XPOST -H "Authorization: Bearer %s" http://%s/promotions -d '{"PackageKind":"Top","BoostWeight":10,"EndsAt":"2030-01-01T00:00:00Z","Targets":[{"TargetKind":"Project","TargetId":"11111111-1111-4111-8111-111111111111"}]}'
       curl -s http://%s/cards/projects/11111111-1111-4111-8111-111111111111
`, p.HTTPAddr, d.apiTokenShown, c.HTTPAddr, d.adminTokenShown, p.Kafka.Brokers, embedded,
		d.adminTokenShown, c.HTTPAddr, d.apiTokenShown, p.HTTPAddr, c.HTTPAddr)
	if d.Demo {
		fmt.Fprintln(w, "  demo          2 projects, 4 purchases, about 25 s (--no-demo or PROMOFLOW_DEMO=0 skips it)")
	}

	return runAll(ctx, log,
		func(ctx context.Context) error { return startPromotion(ctx, p, quietLogger("promotion")) },
		func(ctx context.Context) error { return startCatalog(ctx, c, quietLogger("catalog")) },
		func(ctx context.Context) error {
			if err := waitReady(ctx, localURL(p.HTTPAddr), localURL(c.HTTPAddr)); err != nil {
				return nil // stopped before ready; a part that failed says why
			}
			quiet.ready()
			// dev's start-up record: promotion's and catalog's own "starting" are quiet here.
			log.Info("ready", slices.Concat([]any{"promotionApi", localURL(p.HTTPAddr), "catalogApi", localURL(c.HTTPAddr)},
				buildInfo().logAttrs(), d.memoryLimit)...)
			if d.Demo {
				d.playDemo(ctx, log, screen, out.OnStep)
			}
			<-ctx.Done()
			return nil
		},
	)
}

// playDemo plays the demo once both APIs are ready: on a terminal (screen)
// each event is a line above the live table, elsewhere a log record. A
// failed step is logged and the processes keep running.
func (d devConfig) playDemo(ctx context.Context, log *slog.Logger, screen *demo.Screen, onStep func(context.Context, demo.Step) error) {
	var names []string // validated: dev's demo token or the operator's
	for _, pair := range splitList(d.Promotion.APITokens) {
		token, _, _ := strings.Cut(pair, "=")
		names = append(names, strings.TrimSpace(token))
	}
	slices.Sort(names)
	cfg := demo.Config{PromotionURL: localURL(d.Promotion.HTTPAddr), CatalogURL: localURL(d.Catalog.HTTPAddr),
		CatalogInternalURL: localURL(d.Catalog.AdminAddr),
		APIToken:           names[0], FeedToken: d.Catalog.FeedToken, OnStep: onStep}
	if screen != nil {
		_, noColor := os.LookupEnv("NO_COLOR")
		cfg.OnEvent = func(ev demo.Event) { fmt.Fprintln(screen, demo.EventLine(ev, !noColor)) }
		cfg.OnState = func(s demo.State) { screen.SetFooter(demo.Table(s, time.Now())) }
		defer screen.Close()
	} else {
		cfg.OnEvent = func(ev demo.Event) {
			attrs := []any{"event", ev.Kind}
			if ev.Purchase != "" {
				attrs = append(attrs, "purchase", ev.Purchase, "PurchaseId", ev.PurchaseId.String())
			}
			log.Info("demo", append(attrs, "detail", ev.Text)...)
		}
	}
	if err := demo.Run(ctx, cfg); err != nil {
		log.Error("demo failed; the processes keep running", "error", err.Error())
	}
}
