package sqlmigrate

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMigrate_EveryMigrationDeclaresExpandOrContract(t *testing.T) {
	names, err := fs.Glob(files, "migrations/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	previous := baseline
	for _, name := range names {
		body, err := files.ReadFile(name)
		require.NoError(t, err)
		version := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
		kind, from, err := parseHeader(version, string(body), previous)
		require.NoError(t, err, "every migration's first line is `-- expand: ...` or `-- contract (compatible_from X.Y.Z): ...`")
		require.Contains(t, []Kind{Expand, Contract}, kind, version)
		was, err := parseSemver(previous)
		require.NoError(t, err)
		now, err := parseSemver(from)
		require.NoError(t, err, version)
		require.False(t, now.less(was), "%s: compatible_from %s goes back from %s", version, from, previous)
		previous = from
	}
	all, err := All()
	require.NoError(t, err)
	require.Len(t, all, len(names))
	require.Equal(t, baseline, all[0].CompatibleFrom, "the first migration's baseline")
}
