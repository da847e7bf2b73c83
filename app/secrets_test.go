package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/api"
)

// TestSecrets_FileFormShortTokensAndBothSetAreClear: a token's *_FILE form
// is read without its trailing newline; setting both forms, or a token of
// fewer than 16 characters outside dev, is an error that names the variable
// and shows no part of the token.
func TestSecrets_FileFormShortTokensAndBothSetAreClear(t *testing.T) {
	file := filepath.Join(t.TempDir(), "feed")
	require.NoError(t, os.WriteFile(file, []byte("feed-token-from-a-file\n"), 0o600))
	parse := func(env map[string]string) (catalogConfig, error) {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		var cfg catalogConfig
		s := newSettings("catalog", "")
		cfg.register(s)
		require.NoError(t, s.parse(nil))
		return cfg, errors.Join(resolveSecrets(cfg.secrets...), validateTokenLength(cfg.dev, "CATALOG_FEED_TOKEN", cfg.FeedToken),
			validateTokenLength(cfg.dev, "CATALOG_ADMIN_TOKEN", cfg.AdminToken))
	}
	cfg, err := parse(map[string]string{"CATALOG_FEED_TOKEN_FILE": file})
	require.NoError(t, err)
	require.Equal(t, "feed-token-from-a-file", cfg.FeedToken)

	_, err = parse(map[string]string{"CATALOG_FEED_TOKEN": "feed-token-in-the-environment"})
	require.ErrorIs(t, err, errSecretTwice)
	require.Contains(t, err.Error(), "CATALOG_FEED_TOKEN and CATALOG_FEED_TOKEN_FILE")

	t.Setenv("CATALOG_FEED_TOKEN_FILE", "")
	_, err = parse(map[string]string{"CATALOG_FEED_TOKEN": "", "CATALOG_ADMIN_TOKEN": "hunter2-short"})
	require.ErrorIs(t, err, api.ErrShortToken)
	require.Contains(t, err.Error(), "CATALOG_ADMIN_TOKEN")
	require.NotContains(t, err.Error(), "hunt")

	_, err = api.ParseTokens("hunter2-short=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b", api.MinTokenLength)
	require.ErrorIs(t, err, api.ErrShortToken)
	require.Contains(t, err.Error(), "token 1")
	_, err = api.ParseTokens("hunter2-short=not-a-uuid", api.MinTokenLength)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunt", "no part of a token is shown")
}
