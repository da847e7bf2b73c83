package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

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
