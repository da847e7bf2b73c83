package event_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
)

// schemaFile is the published JSON Schema of the v1 payload.
const schemaFile = "purchase_changed.v1.schema.json"

// compileSchema compiles a JSON Schema file with format assertions on, as a
// strict consumer in another language would validate.
func compileSchema(t testing.TB, path string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	s, err := c.Compile(path)
	require.NoError(t, err)
	return s
}

// validate reports why payload is not one JSON document that s accepts.
func validate(s *jsonschema.Schema, payload []byte) error {
	if !json.Valid(payload) {
		return errors.New("not a JSON document")
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return err
	}
	return s.Validate(doc)
}

func golden(t testing.TB) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "purchase_changed.v1.golden.json"))
	require.NoError(t, err)
	return raw
}

func TestContract_GoldenFileMatchesTheSchema(t *testing.T) {
	require.NoError(t, validate(compileSchema(t, schemaFile), golden(t)))
}

func TestContract_UnknownFieldsAreTolerated(t *testing.T) {
	schema := compileSchema(t, schemaFile)
	extended := edit(t, golden(t), func(m map[string]any) {
		m["Discount"] = map[string]any{"Percent": 5, "Code": "SPRING"}
		m["SchemaHint"] = nil
		m["Targets"].([]any)[0].(map[string]any)["Label"] = "a field of v1.1"
	})
	require.NoError(t, validate(schema, extended), "the schema leaves room for additive changes")

	ev, err := event.Parse(extended)
	require.NoError(t, err, "the consumer applies a v1 event with fields it does not know")
	want, err := event.Parse(golden(t))
	require.NoError(t, err)
	require.Equal(t, want, ev, "and reads the fields it knows as before")
}

// FuzzParse_AgreesWithTheSchema: for any input, event.Parse accepts exactly
// when the published JSON Schema accepts. The consumer checks nothing in the
// payload that the schema does not state; its one check beyond the payload,
// the record key (event.CheckKey), is made on the record. An accepted event
// marshals, as the producer writes it, back to a payload the schema accepts.
func FuzzParse_AgreesWithTheSchema(f *testing.F) {
	f.Add(golden(f))
	for _, shape := range malformedShapes(f, golden(f)) {
		f.Add(shape)
	}
	schema := compileSchema(f, schemaFile)
	f.Fuzz(func(t *testing.T, payload []byte) {
		ev, perr := event.Parse(payload)
		serr := validate(schema, payload)
		if serr == nil && !utf8.Valid(payload) {
			serr = errors.New("not UTF-8: a JSON text is UTF-8 (RFC 8259 §8.1), which the validator does not check")
		}
		if (perr == nil) != (serr == nil) {
			t.Fatalf("the parser and the schema disagree on %s\nparser: %v\nschema: %v", payload, perr, serr)
		}
		if perr != nil {
			var ce *event.ContractError
			if !errors.As(perr, &ce) {
				t.Fatalf("parser failed with %T, not a ContractError: %v", perr, perr)
			}
			return
		}
		raw, err := json.Marshal(ev)
		if err != nil {
			t.Fatalf("marshal the accepted event: %v", err)
		}
		if want := readByEncodingJSON(t, payload); !bytes.Equal(raw, want) {
			t.Fatalf("the parser read other values than encoding/json reads from %s\nparser:        %s\nencoding/json: %s", payload, raw, want)
		}
		if err := validate(schema, raw); err != nil {
			t.Fatalf("the producer's form of an accepted event breaks the schema: %s\n%v", raw, err)
		}
		again, err := event.Parse(raw)
		if err != nil {
			t.Fatalf("the producer's form of an accepted event does not parse: %s\n%v", raw, err)
		}
		if back, _ := json.Marshal(again); !bytes.Equal(back, raw) {
			t.Fatalf("round trip changed the event:\n%s\n%s", raw, back)
		}
	})
}

// readByEncodingJSON is an accepted payload's event as encoding/json reads
// it into maps (the last of a name written twice counts, escapes decoded),
// in the producer's form: the values the parser must have read.
func readByEncodingJSON(t *testing.T, payload []byte) []byte {
	t.Helper()
	var m struct {
		PurchaseId, TenantId, PackageKind, Status, PaymentStatus string
		StartsAt, EndsAt                                         time.Time
		BoostWeight, Version                                     json.Number
		Targets                                                  []map[string]json.RawMessage
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(payload, &members); err != nil {
		t.Fatalf("encoding/json cannot read an accepted payload %s: %v", payload, err)
	}
	fields := map[string]any{"PurchaseId": &m.PurchaseId, "TenantId": &m.TenantId, "PackageKind": &m.PackageKind,
		"Status": &m.Status, "PaymentStatus": &m.PaymentStatus, "StartsAt": &m.StartsAt, "EndsAt": &m.EndsAt,
		"BoostWeight": &m.BoostWeight, "Version": &m.Version, "Targets": &m.Targets}
	for name, into := range fields {
		if err := json.Unmarshal(members[name], into); err != nil {
			t.Fatalf("encoding/json cannot read %s of an accepted payload %s: %v", name, payload, err)
		}
	}
	integer := func(n json.Number) int64 {
		r, ok := new(big.Rat).SetString(string(n))
		if !ok || !r.IsInt() || !r.Num().IsInt64() {
			t.Fatalf("an accepted payload's %s is not an int64", n)
		}
		return r.Num().Int64()
	}
	ev := event.PurchaseChanged{PurchaseId: uuid.MustParse(m.PurchaseId), TenantId: uuid.MustParse(m.TenantId),
		PackageKind: m.PackageKind, BoostWeight: int(integer(m.BoostWeight)), Status: event.Status(m.Status),
		PaymentStatus: m.PaymentStatus, StartsAt: m.StartsAt, EndsAt: m.EndsAt, Version: integer(m.Version)}
	for _, tg := range m.Targets {
		var kind, id string
		require.NoError(t, json.Unmarshal(tg["TargetKind"], &kind))
		require.NoError(t, json.Unmarshal(tg["TargetId"], &id))
		ev.Targets = append(ev.Targets, event.Target{TargetKind: event.TargetKind(kind), TargetId: uuid.MustParse(id)})
	}
	out, err := json.Marshal(ev)
	require.NoError(t, err)
	return out
}

// edit decodes a JSON object (numbers kept as written), applies fn and encodes it.
func edit(t testing.TB, payload []byte, fn func(map[string]any)) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var m map[string]any
	require.NoError(t, dec.Decode(&m))
	fn(m)
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

// malformedShapes are payloads near the golden one that a consumer might
// read differently from the schema: every required field missing or null,
// numbers written as 50.0 or 5e1, UUIDs and times in forms that RFC 4122 or
// RFC 3339 allow but the contract does not, keys in another case,
// duplicate keys, and documents that are not objects.
func malformedShapes(t testing.TB, golden []byte) [][]byte {
	t.Helper()
	var out [][]byte
	set := func(field string, values ...any) {
		for _, v := range values {
			out = append(out, edit(t, golden, func(m map[string]any) { m[field] = v }))
		}
	}
	target := func(kind, id any) []any { return []any{map[string]any{"TargetKind": kind, "TargetId": id}} }
	for _, field := range []string{"PurchaseId", "TenantId", "PackageKind", "Targets", "BoostWeight", "Status",
		"PaymentStatus", "StartsAt", "EndsAt", "Version"} {
		out = append(out, edit(t, golden, func(m map[string]any) { delete(m, field) }))
		set(field, nil)
		out = append(out, edit(t, golden, func(m map[string]any) { m[strings.ToLower(field)] = m[field]; delete(m, field) }))
	}
	const id = "0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"
	set("TenantId", strings.ToUpper(id), "{"+id+"}", "urn:uuid:"+id, strings.ReplaceAll(id, "-", ""),
		"00000000-0000-0000-0000-000000000000", 7, "")
	set("PurchaseId", "00000000-0000-0000-0000-000000000000", "6f1c2a7e-8a54-4c36-9b9e-0d7f2f0f4a1", []any{id})
	set("BoostWeight", json.Number("0"), json.Number("101"), json.Number("50.0"), json.Number("5e1"),
		json.Number("50.5"), json.Number("-0"), json.Number("1e400"), "50", true)
	set("Version", json.Number("0"), json.Number("1.0"), json.Number("9223372036854775807"),
		json.Number("9223372036854775808"), json.Number("-1"), json.Number("2e0"), "2")
	set("Status", "active", "Paused", json.Number("1"), "")
	set("PackageKind", json.Number("1"), []any{}, "")
	set("PaymentStatus", false)
	set("Targets", []any{}, map[string]any{}, []any{json.Number("1")}, []any{map[string]any{"TargetKind": "Post"}},
		target("Shop", id), target("Post", "00000000-0000-0000-0000-000000000000"), target("post", id),
		target("Project", strings.ToUpper(id)), target(nil, id),
		[]any{map[string]any{"TargetKind": "Project", "TargetId": id, "Label": "x"}},
		[]any{map[string]any{"targetkind": "Project", "targetid": id}})
	set("StartsAt", "2026-11-01t00:00:00z", "2026-11-01T23:59:60Z", "2026-02-30T00:00:00Z",
		"2026-11-01T00:00:00+24:00", "2026-11-01T00:00:00.1234567890Z", "2026-11-01 00:00:00Z",
		"2026-11-01T00:00:00", "2026-11-01T+1:00:00Z", "2026-11-01T00:00:00.5+03:00", "0000-01-01T00:00:00Z",
		"2026-11-01T00:00:00-00:30", json.Number("1762000000"))
	set("EndsAt", "2026-12-01T00:00:00.000000001Z", "2026-13-01T00:00:00Z")
	// The bounds PostgreSQL sets: no year 0, offsets within ±15:59.
	set("EndsAt", "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+15:59", "9999-12-31T23:59:59.999999999-15:59",
		"0000-12-31T23:59:59.999999999Z", "0000-01-01T00:00:00-01:00", "2026-11-01T00:00:00+16:00",
		"2026-11-01T00:00:00-16:00", "2026-11-01T00:00:00+23:59", "2026-11-01T00:00:00-15:60")
	set("Extra", map[string]any{"PurchaseId": nil}, []any{nil})
	// Duplicate keys: the last one counts.
	out = append(out,
		append([]byte(`{"TenantId":"x",`), golden[1:]...),
		append([]byte(`{"TenantId":"`+id+`",`), bytes.Replace(golden[1:], []byte(id), []byte("x"), 1)...),
		// Escapes in names and values: decoded before they are read.
		bytes.Replace(golden, []byte(`"PurchaseId"`), []byte(`"Purchase\u0049d"`), 1),
		bytes.Replace(golden, []byte(`"Status": "Expired"`), []byte(`"Status": "\u0045xpired"`), 1),
		bytes.Replace(golden, []byte(`"TargetId": "66666666`), []byte(`"TargetId": "\u00366666666`), 1),
		[]byte(`null`), []byte(`[]`), []byte(`"x"`), []byte(`1`), []byte(`{}`),
		append(bytes.Clone(golden), []byte(` {}`)...),
		append(bytes.Clone(golden), []byte(` `)...),
		golden[:len(golden)/2],
	)
	return out
}
