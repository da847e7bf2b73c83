package main

import (
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
