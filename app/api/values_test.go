package api

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestDecimal_EveryNumberItAcceptsPostgreSQLNumericStores: the card feed's
// prices reach a numeric column, so a decimal the API accepts must store,
// the widest of its form included, and one beyond that form is a 422 (a
// *brokenRule) for a number and a 400 for a string, never a 500 from the
// INSERT as the values were.
func TestDecimal_EveryNumberItAcceptsPostgreSQLNumericStores(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	widest := strings.Repeat("9", 1000) + "." + strings.Repeat("9", 1000)
	for raw, want := range map[string]string{
		widest + "e999":            "ok",
		"-" + widest + "e-999":     "ok",
		`"` + widest + `E+999"`:    "ok",
		`1500000.5`:                "ok",
		`-0`:                       "ok",
		`1.7976931348623157e308`:   "ok",
		`5e-324`:                   "ok",
		`"1500000.50"`:             "ok",
		`"0"`:                      "ok",
		`-5990686084933e652990137`: "rule", // the out-of-range numbers
		`1e1000`:                   "rule",
		"1" + widest:               "rule",
		`"-94.4E652990137"`:        "form", // and its string
		`"1e1000"`:                 "form",
		`"01"`:                     "form",
		`"1."`:                     "form",
		`"NaN"`:                    "form",
		`true`:                     "form",
	} {
		var d decimal
		err := json.Unmarshal([]byte(raw), &d)
		var broken *brokenRule
		switch {
		case err == nil:
			require.Equal(t, "ok", want, "%.40s was accepted", raw)
			var stored int
			require.NoError(t, db.Get(&stored, `SELECT length($1::numeric::text)`, string(d)), "%.40s does not store", raw)
		case errors.As(err, &broken):
			require.Equal(t, "rule", want, "%.40s: %v", raw, err)
		default:
			require.Equal(t, "form", want, "%.40s: %v", raw, err)
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

// TestValues_PatternsAreTheDocuments: the forms the API reads are the
// patterns its documents publish, character for character.
func TestValues_PatternsAreTheDocuments(t *testing.T) {
	t.Parallel()
	pattern := func(doc []byte, schema, property string) string {
		var d struct {
			Components struct {
				Schemas map[string]struct {
					Properties map[string]struct{ Pattern string }
				}
			}
		}
		require.NoError(t, json.Unmarshal(doc, &d))
		return d.Components.Schemas[schema].Properties[property].Pattern
	}
	for _, tc := range []struct {
		doc              []byte
		schema, property string
		want             string
	}{
		{catalogDocument, "ProjectCardFeed", "MinPrice", decimalPattern.String()},
		{catalogDocument, "ProjectCardFeed", "Payback", decimalPattern.String()},
		{catalogDocument, "PropertyObjectCardFeed", "Price", decimalPattern.String()},
		{promotionDocument, "CreatePurchase", "StartsAt", dateTimePattern.String()},
		{promotionDocument, "CreatePurchase", "EndsAt", dateTimePattern.String()},
	} {
		require.Equal(t, tc.want, pattern(tc.doc, tc.schema, tc.property), "%s.%s", tc.schema, tc.property)
	}
}
