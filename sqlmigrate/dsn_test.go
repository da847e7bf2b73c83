package sqlmigrate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lib/pq"
)

// FuzzSplitKeyValues_ReadsAsLibPQDoes: dsnError reads a key=value connection
// string as lib/pq does. A string it finds malformed lib/pq refuses, and the
// settings it splits one into, written again in quotes, are what lib/pq
// reads from it (the same error or none), so that a refused value is found
// in the setting that holds it.
func FuzzSplitKeyValues_ReadsAsLibPQDoes(f *testing.F) {
	for _, dsn := range []string{"host=db password=a b", "password='x", `password=x\`, `a = 'b c\' d' e=f\ g`,
		"=x", "port=5x", "host=db port=", "sslmode='verify-full'x=y", "  "} {
		f.Add(dsn)
	}
	quote := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	f.Fuzz(func(t *testing.T, dsn string) {
		if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
			return
		}
		settings, problem := splitKeyValues(dsn)
		_, err := pq.NewConfig(dsn)
		if problem != "" {
			if err == nil {
				t.Fatalf("%q: %s, but lib/pq reads it", dsn, problem)
			}
			return
		}
		var again strings.Builder
		for _, s := range settings {
			fmt.Fprintf(&again, "%s='%s' ", s.name, quote.Replace(s.value))
		}
		_, errAgain := pq.NewConfig(again.String())
		if fmt.Sprint(err) != fmt.Sprint(errAgain) {
			t.Fatalf("%q is read as %q\nlib/pq: %v\nas split: %v", dsn, again.String(), err, errAgain)
		}
	})
}
