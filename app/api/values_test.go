package api

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestDecimal_EveryNumberItAcceptsPostgreSQLNumericStores: the card feed's
// prices reach a numeric column, so a number the API accepts must store, and
// one beyond numeric's range is a 422 (a *brokenRule), never a 500 from the
// INSERT. Strings are held to the document's pattern, inside that range.
func TestDecimal_EveryNumberItAcceptsPostgreSQLNumericStores(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for raw, want := range map[string]string{
		`1e131071`:          "ok", // 131072 digits before the point
		`1e131072`:          "rule",
		`0.01e131073`:       "ok",
		`-94.4E652990`:      "rule",
		`1e-16383`:          "ok", // 16383 digits after it
		`1e-16384`:          "rule",
		`0e-16384`:          "rule", // numeric counts a zero's scale too
		`1.5e-16382`:        "ok",
		`0e1000000`:         "ok",
		`0e1000001`:         "exponent", // numeric stores it, but the API reads no wider exponent
		`-0`:                "ok",
		`1500000.5`:         "ok",
		`"1500000.50"`:      "ok",
		`"1e999"`:           "ok",
		`"-94.4E652990137"`: "form", // the 500: a four-digit exponent and more
		`"1e1000"`:          "form",
		`"01"`:              "form",
		`"1."`:              "form",
		`"NaN"`:             "form",
		`true`:              "form",
	} {
		var d decimal
		err := json.Unmarshal([]byte(raw), &d)
		var broken *brokenRule
		switch {
		case err == nil:
			require.Equal(t, "ok", want, "%s was accepted", raw)
			var stored string
			require.NoError(t, db.Get(&stored, `SELECT left($1::numeric::text, 20)`, string(d)), "%s does not store", raw)
		case errors.As(err, &broken) && want == "exponent":
		case errors.As(err, &broken):
			require.Equal(t, "rule", want, "%s: %v", raw, err)
			_, pgErr := db.Exec(`SELECT $1::numeric`, raw)
			require.Error(t, pgErr, "%s is refused but numeric stores it", raw)
		default:
			require.Equal(t, "form", want, "%s: %v", raw, err)
		}
	}
}

// TestInteger_WholeNumbersInAnyJSONFormAreIntegers: JSON Schema's integer is a
// number whose value is whole, whatever its spelling.
func TestInteger_WholeNumbersInAnyJSONFormAreIntegers(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]any{
		`5`: int64(5), `5.0`: int64(5), `5e0`: int64(5), `50e-1`: int64(5), `0.5e1`: int64(5), `-0`: int64(0),
		`0e-5`: int64(0), `0e1000000`: int64(0), `9223372036854775807`: int64(9223372036854775807),
		`-9223372036854775808`: int64(-9223372036854775808),
		`9223372036854775808`:  "rule", `1e19`: "rule", `1e400`: "rule",
		`5.5`: "form", `1e-1`: "form", `"5"`: "form", `null`: "form", `true`: "form",
	} {
		var n integer
		err := json.Unmarshal([]byte(raw), &n)
		var broken *brokenRule
		switch {
		case err == nil:
			require.Equal(t, want, int64(n), raw)
		case errors.As(err, &broken):
			require.Equal(t, "rule", want, "%s: %v", raw, err)
		default:
			require.Equal(t, "form", want, "%s: %v", raw, err)
		}
	}
}
