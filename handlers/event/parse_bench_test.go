package event_test

import (
	"testing"

	"github.com/promoflow/promoflow/handlers/event"
)

// BenchmarkParse measures decoding and validating one payload, what the
// consumer does once per event.
func BenchmarkParse(b *testing.B) {
	payload := golden(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := event.Parse(payload); err != nil {
			b.Fatal(err)
		}
	}
}
