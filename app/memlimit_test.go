package main

import (
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router"
)

func TestMemoryLimit_FollowsTheBuffersUnlessSet(t *testing.T) {
	assert.EqualValues(t, 80<<20, memoryLimit(0, router.ConsumerBuffers{}), "60 MiB + 16 MiB read-ahead + 4 MiB response")
	assert.EqualValues(t, 60<<20+64<<20+4<<20, memoryLimit(0, router.ConsumerBuffers{ReadAheadBytes: 64 << 20}))
	assert.EqualValues(t, 200<<20, memoryLimit(200<<20, router.ConsumerBuffers{}))
	assert.EqualValues(t, -1, memoryLimit(-1, router.ConsumerBuffers{}))
	require.Error(t, validateMemoryLimit(1<<20))
	require.NoError(t, validateMemoryLimit(0))
	require.NoError(t, validateMemoryLimit(-1))
}

func TestMemoryLimit_IsSetOnTheRuntimeAndGOMEMLIMITWins(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	catalog := func(limit int) int64 { return memoryLimit(limit, router.ConsumerBuffers{}) }

	t.Setenv("GOMEMLIMIT", "1GiB")
	applyMemoryLimit(catalog(0), log)
	assert.Equal(t, before, debug.SetMemoryLimit(-1), "GOMEMLIMIT set: the runtime's limit stays")

	require.NoError(t, os.Unsetenv("GOMEMLIMIT"))
	applyMemoryLimit(catalog(0), log)
	assert.EqualValues(t, 80<<20, debug.SetMemoryLimit(-1), "the limit from the buffers")

	debug.SetMemoryLimit(before)
	applyMemoryLimit(catalog(-1), log)
	assert.Equal(t, before, debug.SetMemoryLimit(-1), "-1: no limit set")
}

// TestMemoryLimit_FollowsTheCgroupLimitOfV1AndV2UnlessMax: the container's
// limit is read from cgroup v2's memory.max, else v1's
// memory.limit_in_bytes; "max" and v1's near-MaxInt64 mean none, and a
// process without a limit of its own runs at 90% of the container's.
func TestMemoryLimit_FollowsTheCgroupLimitOfV1AndV2UnlessMax(t *testing.T) {
	const dir = "testdata/cgroup/"
	for _, tc := range []struct {
		files []string
		want  int64
	}{
		{[]string{dir + "v2-memory.max", dir + "v1-memory.limit_in_bytes"}, 256 << 20},
		{[]string{dir + "missing", dir + "v1-memory.limit_in_bytes"}, 512 << 20},
		{[]string{dir + "v2-unlimited-memory.max", dir + "v1-memory.limit_in_bytes"}, 0},
		{[]string{dir + "missing", dir + "v1-unlimited-memory.limit_in_bytes"}, 0},
		{[]string{dir + "missing", dir + "missing-too"}, 0},
	} {
		got, _, err := cgroupMemoryLimit(tc.files)
		require.NoError(t, err, "%v", tc.files)
		assert.Equal(t, tc.want, got, "cgroup memory limit from %v", tc.files)
	}
	_, file, err := cgroupMemoryLimit([]string{dir + "garbage-memory.max"})
	require.Error(t, err, "a limit that is neither bytes nor max")
	assert.Equal(t, dir+"garbage-memory.max", file)

	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	files := cgroupMemoryFiles
	t.Cleanup(func() { cgroupMemoryFiles = files })
	require.NoError(t, os.Unsetenv("GOMEMLIMIT"))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	cgroupMemoryFiles = []string{dir + "v2-memory.max"}
	assert.Equal(t, []any{"memoryLimit", int64(241591910), "memoryLimitSource", "cgroup", "cgroupMemoryLimit", int64(256 << 20),
		"cgroupFile", dir + "v2-memory.max"}, applyMemoryLimit(0, log), "what the start-up record says")
	assert.EqualValues(t, 241591910, debug.SetMemoryLimit(-1), "90%% of the container's 256 MiB")

	debug.SetMemoryLimit(before)
	cgroupMemoryFiles = []string{dir + "v2-unlimited-memory.max"}
	assert.Equal(t, []any{"memoryLimit", "none", "memoryLimitSource", "cgroup"}, applyMemoryLimit(0, log))
	assert.Equal(t, before, debug.SetMemoryLimit(-1), "max: no limit set")

	cgroupMemoryFiles = []string{dir + "v2-memory.max"}
	t.Setenv("GOMEMLIMIT", "1GiB")
	assert.Equal(t, []any{"memoryLimit", "1GiB", "memoryLimitSource", "GOMEMLIMIT"}, applyMemoryLimit(0, log))
	assert.Equal(t, before, debug.SetMemoryLimit(-1), "GOMEMLIMIT set: the runtime's limit stays")
}
