package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestDSN_MultiHostURLFormIsRefusedClearly: a URL that gives each of several
// hosts its port, which lib/pq reads as one host name, ends the process at
// once with an error that names the key=value form that follows the primary;
// it does not wait on a host that does not exist. The forms that work open.
func TestDSN_MultiHostURLFormIsRefusedClearly(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{})
	url := fmt.Sprintf("postgres://postgres@%s:%d,%s:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		srv.Host, srv.Port, srv.Host, srv.Port)
	p := startCommand(t, envOf("DATABASE_URL="+url, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ",")),
		"promotion", "--http-addr", freeAddr(t), "--topic", "pf-test-"+kafkatest.RandomSuffix())
	code, ended := p.wait(databaseWaitDefault / 2)
	require.True(t, ended, "the process still runs (it waits on the misread host); output:\n%s", p.output())
	require.Equal(t, 1, code)
	out := p.output()
	t.Logf("printed:\n%s", out)
	require.Contains(t, out, "promoflow: database URL: the URL form cannot give each host its own port")
	require.Contains(t, out, "host=h1,h2 port=5432,5432 user=user dbname=db target_session_attrs=read-write")
	require.NotContains(t, out, "database not ready, retrying")

	_, err := sqlmigrate.Open(url)
	require.True(t, errors.Is(err, sqlmigrate.ErrMultiHostURL), "typed: %v", err)
	keyword := fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
		srv.Host, srv.Host, srv.Port, srv.Port)
	portList := fmt.Sprintf("postgres://postgres@%s,%s/postgres?port=%d,%d&sslmode=disable&target_session_attrs=read-write",
		srv.Host, srv.Host, srv.Port, srv.Port)
	for _, dsn := range []string{keyword, portList, srv.URL("sslmode=disable")} {
		db := openTest(t, dsn)
		require.NoError(t, db.Ping(), "%s opens", dsn)
	}
}

// TestReadyz_FalseOnAStandby: a promotion process whose DATABASE_URL points
// at a hot standby runs but answers /readyz 503, naming the standby; once the
// standby is promoted it becomes ready, and its API writes, without a
// restart. The relay counts its refused queries, and says once that it
// pauses and once that it resumes.
func TestReadyz_FalseOnAStandby(t *testing.T) {
	t.Parallel()
	primary, standby, url := primaryAndStandby(t)
	standbyURL := strings.Replace(url, fmt.Sprintf(":%d/", primary.Port), fmt.Sprintf(":%d/", standby.Port), 1)

	topic := "pf-test-" + kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, topic)
	addr := freeAddr(t)
	p := startCommand(t, envOf("DATABASE_URL="+standbyURL, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","),
		"MIGRATE_ON_START=false", "HTTP_ADDR="+addr, "PROMOTION_TOPIC="+topic, "KAFKA_TOPIC_PARTITIONS=1",
		"PROMOTION_API_TOKENS=tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"), "promotion")
	var body string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var status int
		status, body = readyzAnswer(internalOf(addr)) // the internal /readyz shows why
		assert.Equal(c, http.StatusServiceUnavailable, status, "/readyz on a standby: %s", body)
		assert.Contains(c, body, "standby")
	}, 60*time.Second, 100*time.Millisecond, "output:\n%s", p)
	t.Logf("/readyz on the standby: %s", body)
	require.Eventually(t, func() bool {
		return metricValue(t, addr, `promotion_outbox_relay_errors_total{reason="read_only"}`) >= 2
	}, 30*time.Second, 100*time.Millisecond, "the relay counts its refused queries")

	standby.Promote(t)
	p.waitReady(t, addr)
	createPurchase(t, addr, "tenant-one-token-01", time.Hour)
	require.Eventually(t, func() bool {
		return strings.Contains(p.output(), "the database takes writes again: relay resumes")
	}, 30*time.Second, 100*time.Millisecond, "the relay says it resumes; output:\n%s", p)
	out := p.output()
	require.NotContains(t, out, `"level":"ERROR"`, "a standby is a state, logged once, not an error each second")
	require.Equal(t, 1, strings.Count(out, "the database takes no writes: relay paused"), out)
}

// primaryAndStandby is a private primary with a migrated database of the
// test's own at url, and a hot standby that has replayed it.
func primaryAndStandby(t *testing.T) (primary, standby *pgtest.Server, url string) {
	t.Helper()
	primary = pgtest.StartServer(t, pgtest.ServerOptions{})
	url = pgtest.DatabaseURLOn(t, primary.URL("sslmode=disable"))
	pgtest.Open(t, url) // migrated on the primary
	standby = primary.StartStandby(t, "s1")
	primary.WaitReplayed(t, standby)
	return primary, standby, url
}

// readyzAnswer is the status and body /readyz of the process at addr answers.
func readyzAnswer(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// TestDSN_MultiHostKeywordFormFollowsThePrimary: with DATABASE_URL in the
// key=value form that lists the primary and its standby with
// target_session_attrs=read-write, a promotion process lives through a
// failover (the primary killed, the standby promoted) without a restart:
// the API writes again and the relay publishes the new purchase's event.
func TestDSN_MultiHostKeywordFormFollowsThePrimary(t *testing.T) {
	t.Parallel()
	primary, standby, url := primaryAndStandby(t)
	name, _, _ := strings.Cut(url[strings.LastIndex(url, "/")+1:], "?")
	dsn := fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=%s sslmode=disable target_session_attrs=read-write",
		primary.Host, standby.Host, primary.Port, standby.Port, name)

	topic := "pf-test-" + kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, topic)
	addr := freeAddr(t)
	p := startCommand(t, envOf("DATABASE_URL="+dsn, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","),
		"HTTP_ADDR="+addr, "PROMOTION_TOPIC="+topic, "KAFKA_TOPIC_PARTITIONS=1",
		"PROMOTION_API_TOKENS=tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"), "promotion")
	p.waitReady(t, addr)
	before := createPurchase(t, addr, "tenant-one-token-01", time.Hour)
	kafkatest.ReadTopic(t, topic, 30*time.Second, func(got []*sarama.ConsumerMessage) bool { return hasKey(got, before.String()) })

	primary.WaitReplayed(t, standby)
	primary.Kill(t)
	standby.Promote(t)
	var after purchaseAnswer
	require.Eventually(t, func() bool {
		var err error
		after, err = postPurchase(addr, "tenant-one-token-01", uuid.New(), 5, time.Hour)
		return err == nil && after.Status == http.StatusCreated
	}, 60*time.Second, 100*time.Millisecond, "the API writes on the promoted standby; output:\n%s", p)
	kafkatest.ReadTopic(t, topic, 60*time.Second, func(got []*sarama.ConsumerMessage) bool { return hasKey(got, after.ID.String()) })
	require.Equal(t, http.StatusOK, readyz(addr))
}

// hasKey reports whether a record of got has key.
func hasKey(got []*sarama.ConsumerMessage, key string) bool {
	for _, m := range got {
		if string(m.Key) == key {
			return true
		}
	}
	return false
}
