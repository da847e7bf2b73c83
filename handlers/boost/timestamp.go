package boost

import (
	"fmt"
	"time"
)

// timestamptz is t as text that PostgreSQL reads as a timestamptz, in UTC:
// the apply statement's and the staging COPY's form of a contract time. No
// offset reaches SQL, so what PostgreSQL stores depends on the instant alone.
//
// An instant before year 1 in UTC (0001-01-01T00:00:00+01:00, which the
// contract allows) is written in PostgreSQL's own form, 0001-12-31T23:00:00Z
// BC: RFC 3339 would write the year 0000, which PostgreSQL refuses. Both
// count days the same (proleptic Gregorian, 1 BC a leap year), so only the
// year changes.
func timestamptz(t time.Time) string {
	const layout = "-01-02T15:04:05.999999999Z07:00"
	u := t.UTC()
	if u.Year() < 1 {
		return fmt.Sprintf("%04d%s BC", 1-u.Year(), u.Format(layout))
	}
	return u.Format("2006" + layout)
}
