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

	t.Setenv("GOMEMLIMIT", "1GiB")
	applyMemoryLimit(0, router.ConsumerBuffers{}, log)
	assert.Equal(t, before, debug.SetMemoryLimit(-1), "GOMEMLIMIT set: the runtime's limit stays")

	require.NoError(t, os.Unsetenv("GOMEMLIMIT"))
	applyMemoryLimit(0, router.ConsumerBuffers{}, log)
	assert.EqualValues(t, 80<<20, debug.SetMemoryLimit(-1), "the limit from the buffers")

	debug.SetMemoryLimit(before)
	applyMemoryLimit(-1, router.ConsumerBuffers{}, log)
	assert.Equal(t, before, debug.SetMemoryLimit(-1), "-1: no limit set")
}
