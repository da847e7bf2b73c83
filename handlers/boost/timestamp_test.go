package boost

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTimestamptz_SendsTheInstantInUTC: the apply statement and the staging
// COPY get a contract time as its instant in UTC, whatever offset the event
// was written with, and an instant before year 1 in PostgreSQL's BC form
// (FuzzParse_AcceptedEventsAreStorable stores each against PostgreSQL).
func TestTimestamptz_SendsTheInstantInUTC(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return v
	}
	for written, sent := range map[string]string{
		"2026-12-01T00:00:00Z":                "2026-12-01T00:00:00Z",
		"2026-12-01T03:30:00.5+03:30":         "2026-12-01T00:00:00.5Z",
		"2026-11-30T08:01:00-15:59":           "2026-12-01T00:00:00Z",
		"0001-01-01T00:00:00Z":                "0001-01-01T00:00:00Z",
		"0001-01-01T00:00:00+15:59":           "0001-12-31T08:01:00Z BC",
		"9999-12-31T23:59:59.999999999-15:59": "10000-01-01T15:58:59.999999999Z",
	} {
		require.Equal(t, sent, timestamptz(at(written)), "sent for %s", written)
	}
}
