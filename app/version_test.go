package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVersion_MatchesTheVersionFile: the binary's Version is what the
// repository's VERSION file says, so a release bumps one and the test
// catches the other.
func TestVersion_MatchesTheVersionFile(t *testing.T) {
	b, err := os.ReadFile("../VERSION")
	require.NoError(t, err)
	require.Equal(t, strings.TrimSpace(string(b)), Version, "app.Version differs from the VERSION file: change both")
}
