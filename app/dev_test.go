package main

import (
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestDev_PrintsTheDemoTokensItMadeUpAndNoneTheOperatorSet: promoflow dev
// prints the demo tokens it made up, which a laptop demo needs, but never a
// token the operator set (CATALOG_ADMIN_TOKEN, PROMOTION_API_TOKENS), since
// its output goes to terminals and logs: it names where that one comes from.
func TestDev_PrintsTheDemoTokensItMadeUpAndNoneTheOperatorSet(t *testing.T) {
	t.Parallel()
	// Nothing answers there: dev prints its banner before it reaches the
	// database, and the test stops it while it waits.
	noDatabase := "postgres://promoflow@" + freeAddr(t) + "/none?sslmode=disable"
	output := func(t *testing.T, env map[string]string) string {
		t.Helper()
		env["DATABASE_URL"] = noDatabase
		c := startCommand(t, env, "dev")
		require.Eventually(t, func() bool { return strings.Contains(c.output(), "curl -s http://") },
			30*time.Second, 20*time.Millisecond, "no banner; output:\n%s", c)
		c.stop()
		return c.output()
	}

	t.Run("the operator's tokens", func(t *testing.T) {
		t.Parallel()
		admin, api := "admin-secret-"+pgtest.RandomSuffix(), "api-secret-"+pgtest.RandomSuffix()
		out := output(t, map[string]string{"CATALOG_ADMIN_TOKEN": admin,
			"PROMOTION_API_TOKENS": api + "=00000000-0000-4000-8000-000000000002"})
		require.NotContains(t, out, admin, "dev printed the operator's admin token")
		require.NotContains(t, out, api, "dev printed the operator's API token")
		require.NotContains(t, out, devAdminToken, "the demo admin token is not valid when the operator set one")
		require.NotContains(t, out, "Bearer "+devAPIToken, "the demo API token is not valid when the operator set tokens")
		require.Contains(t, out, `-H "Authorization: Bearer $CATALOG_ADMIN_TOKEN"`, "the banner's commands use the operator's admin token")
		require.Contains(t, out, "Bearer <a token of PROMOTION_API_TOKENS>")
	})
	t.Run("demo tokens", func(t *testing.T) {
		t.Parallel()
		out := output(t, map[string]string{})
		require.Contains(t, out, "(admin: Bearer "+devAdminToken+")")
		require.Contains(t, out, "(Authorization: Bearer "+devAPIToken+")")
	})
}

// metricValue is the value of the sample line that starts with name on the
// /metrics of the process at addr, read on its internal listener (-1 when there is none).
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + internalOf(addr) + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	return -1
}

// TestDev_StartsQuietlyThenShowsOnlyWhatChanges: promoflow dev prints its
// banner, a ready line, and while nothing happens (no demo: --no-demo, or
// PROMOFLOW_DEMO=0) nothing more, however many expirer cycles run;
// LOG_LEVEL=debug shows what it kept back (Watermill's start-up, the empty
// cycles).
func TestDev_StartsQuietlyThenShowsOnlyWhatChanges(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"info", "debug"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			promotion, catalog := freeAddr(t), freeAddr(t)
			env := map[string]string{"DATABASE_URL": pgtest.DatabaseURL(t), "HTTP_ADDR": promotion,
				"DEV_CATALOG_HTTP_ADDR": catalog, "EXPIRE_INTERVAL": "300ms", "KAFKA_TOPIC_PARTITIONS": "4",
				"LOG_FORMAT": "text", "LOG_LEVEL": level}
			args := []string{"dev", "--no-demo"} // nothing happens but the expirer's cycles
			if level == "info" {
				env["PROMOFLOW_DEMO"], args = "0", []string{"dev"}
			}
			c := startCommand(t, env, args...)
			c.waitReady(t, catalog)
			require.Eventually(t, func() bool { return strings.Contains(c.output(), " INF ready service=dev") },
				30*time.Second, 20*time.Millisecond, "no ready line; output:\n%s", c)
			require.Eventually(t, func() bool { return metricValue(t, promotion, "promotion_expire_run_total") >= 3 },
				30*time.Second, 50*time.Millisecond, "the expirer ran no cycles; output:\n%s", c)
			c.stop()
			out := c.output()
			require.Contains(t, out, "promoflow dev\n  purchase API  http://"+promotion)
			require.Contains(t, out, " INF stopped service=dev")
			if level == "debug" {
				for _, kept := range []string{" DBG Adding handler ", " DBG Starting handler ", " DBG migrations applied ",
					" DBG cycle started service=promotion runId=", " DBG batch selected ", " DBG cycle completed "} {
					require.Contains(t, out, kept)
				}
				return
			}
			var records []string
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, " INF ") || strings.Contains(line, " DBG ") {
					records = append(records, line)
				}
			}
			require.Len(t, records, 2, "dev logged more than its ready and stopped lines:\n%s", out)
		})
	}
}

// TestDevSettings_TheDemoRunsUnlessNoDemoOrPromoflowDemoIsFalse: --no-demo
// wins over $PROMOFLOW_DEMO as any flag wins over its variable.
func TestDevSettings_TheDemoRunsUnlessNoDemoOrPromoflowDemoIsFalse(t *testing.T) {
	for _, tc := range []struct {
		env  string // $PROMOFLOW_DEMO; "-" for unset
		args []string
		demo bool
	}{
		{"-", nil, true},
		{"0", nil, false},
		{"false", nil, false},
		{"1", []string{"--no-demo"}, false},
		{"0", []string{"--demo"}, true},
		{"-", []string{"--demo=false"}, false},
	} {
		t.Setenv("PROMOFLOW_DEMO", tc.env)
		if tc.env == "-" {
			require.NoError(t, os.Unsetenv("PROMOFLOW_DEMO"))
		}
		d, err := parseDev(append([]string{"--database-url", "postgres://promoflow@127.0.0.1:1/none"}, tc.args...))
		require.NoError(t, err)
		require.Equal(t, tc.demo, d.Demo, "PROMOFLOW_DEMO=%s %v", tc.env, tc.args)
	}
}

// TestDev_RefusesAnAddressBeyondLoopbackUnlessAllowedAndThenItsDemoTokens:
// dev listens on loopback; elsewhere only with --allow-remote
// ($DEV_ALLOW_REMOTE), and then with the operator's own tokens, never the
// demo ones it would make up.
func TestDev_RefusesAnAddressBeyondLoopbackUnlessAllowedAndThenItsDemoTokens(t *testing.T) {
	const ownTokens, ownAdmin = "s3cret=00000000-0000-4000-8000-000000000002", "admin-s3cret"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want error // nil: dev starts
	}{
		{"loopback by default", nil, nil, nil},
		{"localhost", nil, []string{"--http-addr", "localhost:8080", "--catalog-http-addr", "[::1]:8081"}, nil},
		{"every interface", nil, []string{"--http-addr", ":8080"}, errDevNotLoopback},
		{"a remote catalog", map[string]string{"DEV_CATALOG_HTTP_ADDR": "0.0.0.0:8081"}, nil, errDevNotLoopback},
		{"a host name", nil, []string{"--http-addr", "dev.example.internal:8080"}, errDevNotLoopback},
		{"a remote internal listener", nil, []string{"--admin-addr", ":9080"}, errDevNotLoopback},
		{"tokens alone do not allow it", map[string]string{"PROMOTION_API_TOKENS": ownTokens, "CATALOG_ADMIN_TOKEN": ownAdmin},
			[]string{"--http-addr", "0.0.0.0:8080"}, errDevNotLoopback},
		{"allowed, no tokens", nil, []string{"--http-addr", "0.0.0.0:8080", "--allow-remote"}, errDevDemoTokens},
		{"allowed, no admin token", map[string]string{"PROMOTION_API_TOKENS": ownTokens},
			[]string{"--http-addr", "0.0.0.0:8080", "--allow-remote"}, errDevDemoTokens},
		{"allowed, the demo API token", map[string]string{"PROMOTION_API_TOKENS": devAPIToken + "=" + devTenant, "CATALOG_ADMIN_TOKEN": ownAdmin},
			[]string{"--http-addr", "0.0.0.0:8080", "--allow-remote"}, errDevDemoTokens},
		{"allowed, the demo admin token", map[string]string{"PROMOTION_API_TOKENS": ownTokens, "CATALOG_ADMIN_TOKEN": devAdminToken},
			[]string{"--http-addr", "0.0.0.0:8080", "--allow-remote"}, errDevDemoTokens},
		{"allowed with its own tokens", map[string]string{"PROMOTION_API_TOKENS": ownTokens, "CATALOG_ADMIN_TOKEN": ownAdmin},
			[]string{"--http-addr", "0.0.0.0:8080", "--allow-remote"}, nil},
		{"allowed by DEV_ALLOW_REMOTE", map[string]string{"PROMOTION_API_TOKENS": ownTokens, "CATALOG_ADMIN_TOKEN": ownAdmin,
			"DEV_ALLOW_REMOTE": "true", "HTTP_ADDR": ":8080"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"PROMOTION_API_TOKENS", "CATALOG_ADMIN_TOKEN", "DEV_ALLOW_REMOTE", "HTTP_ADDR", "DEV_CATALOG_HTTP_ADDR"} {
				t.Setenv(k, tc.env[k])
				if _, ok := tc.env[k]; !ok {
					require.NoError(t, os.Unsetenv(k))
				}
			}
			_, err := parseDev(append([]string{"--database-url", "postgres://promoflow@127.0.0.1:1/none"}, tc.args...))
			if tc.want == nil {
				require.NoError(t, err, "%v %v", tc.env, tc.args)
				return
			}
			require.ErrorIs(t, err, tc.want, "%v %v", tc.env, tc.args)
			t.Logf("refused: %v", err)
		})
	}
}
