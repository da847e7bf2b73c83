package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The form purchase_changed.v1.schema.json allows for a time, written as
// its pattern is. Its year is 0001 at least and its UTC offset within
// ±15:59 because the catalog stores the times in PostgreSQL, which has no
// year 0 and refuses a wider offset ("time zone displacement out of range").
var (
	timeForm = regexp.MustCompile(`^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-](0[0-9]|1[0-5]):[0-5][0-9])$`)
)

// Parse decodes and validates a payload: it accepts exactly what
// purchase_changed.v1.schema.json accepts (FuzzParse_AgreesWithTheSchema).
// Every failure is a *ContractError. Field names are matched in their exact
// case, every field is required, a number is an integer when it has no
// fraction (50.0 is 50), and unknown fields are ignored so that additive
// contract changes stay compatible.
func Parse(payload []byte) (PurchaseChanged, error) {
	if !json.Valid(payload) {
		// The decoder's own words for what is wrong, as one check of the
		// whole payload finds it.
		err := json.Unmarshal(payload, new(json.RawMessage))
		return PurchaseChanged{}, &ContractError{Reason: "malformed JSON: " + err.Error()}
	}
	if !utf8.Valid(payload) {
		// A JSON text is UTF-8 (RFC 8259 §8.1); decoders that take other
		// bytes replace them, and the event would not be what was sent.
		return PurchaseChanged{}, &ContractError{Reason: "the payload is not valid UTF-8"}
	}
	var buf [16]member
	obj, ok := splitObject(payload, buf[:0])
	if !ok {
		return PurchaseChanged{}, &ContractError{Reason: "the payload is not a JSON object"}
	}
	d := fields{obj: obj}
	ev := PurchaseChanged{
		PurchaseId:    d.id("PurchaseId"),
		TenantId:      d.id("TenantId"),
		PackageKind:   d.text("PackageKind"),
		Targets:       d.targets("Targets"),
		BoostWeight:   int(d.integer("BoostWeight")),
		Status:        Status(d.enum("Status", string(StatusActive), string(StatusExpired), string(StatusCancelled), string(StatusPending))),
		PaymentStatus: d.text("PaymentStatus"),
		StartsAt:      d.time("StartsAt"),
		EndsAt:        d.time("EndsAt"),
		Version:       d.integer("Version"),
	}
	// Every violation, each field once: a member that failed to decode is
	// not checked again for its range.
	errs := d.errs
	for _, v := range ev.violations() {
		if !d.failed(v.(*ContractError).Field) {
			errs = append(errs, v)
		}
	}
	if len(errs) > 0 {
		return PurchaseChanged{}, joinViolations(errs)
	}
	return ev, nil
}

// fields reads the members of one JSON object, each of the type the schema
// states, and collects a *ContractError per member that is missing or of
// another type. Ranges and enums are Validate's. The object is the item at
// index item of the array member list, or the payload itself when list is
// empty.
type fields struct {
	obj  object
	list string
	item int
	errs []error
}

func (d *fields) bad(name, reason string) {
	field := name
	if d.list != "" {
		field = fmt.Sprintf("%s[%d].%s", d.list, d.item, name)
	}
	d.errs = append(d.errs, &ContractError{Field: field, Reason: reason})
}

// JSON types by the first byte of a value.
func isString(b byte) bool { return b == '"' }
func isArray(b byte) bool  { return b == '[' }
func isNumber(b byte) bool { return b == '-' || b >= '0' && b <= '9' }

// member returns the raw value of name, or nil (a violation) when it is
// missing or not of the JSON type kind, which its first byte tells (is).
func (d *fields) member(name, kind string, is func(byte) bool) []byte {
	raw, ok := d.obj.get(name)
	if !ok {
		d.bad(name, "is required")
		return nil
	}
	if len(raw) == 0 || !is(raw[0]) {
		d.bad(name, "must be "+kind)
		return nil
	}
	return raw
}

// str reads a string member's value; ok is false after a violation. The
// bytes are the payload's own when the string has no escape.
func (d *fields) str(name string) (s []byte, ok bool) {
	raw := d.member(name, "a string", isString)
	if raw == nil {
		return nil, false
	}
	if s, ok := plainString(raw); ok {
		return s, true
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		d.bad(name, "must be a string")
		return nil, false
	}
	return []byte(v), true
}

// plainString is the value of a JSON string with no escape in valid UTF-8,
// which is its bytes between the quotes: what json.Unmarshal decodes, read
// without a second decoder (the payload was checked whole). Escapes and
// invalid UTF-8, which json.Unmarshal replaces, take the decoder.
func plainString(raw []byte) ([]byte, bool) {
	if len(raw) < 2 || bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		return nil, false
	}
	return raw[1 : len(raw)-1], true
}

func (d *fields) text(name string) string {
	s, _ := d.str(name)
	return string(s)
}

// enum is text that is most often one of known, returned without a copy.
func (d *fields) enum(name string, known ...string) string {
	s, _ := d.str(name)
	for _, k := range known {
		if string(s) == k {
			return k
		}
	}
	return string(s)
}

func (d *fields) id(name string) uuid.UUID {
	s, ok := d.str(name)
	if !ok {
		return uuid.Nil
	}
	if !canonicalID(s) {
		d.bad(name, fmt.Sprintf("%q is not a lower-case canonical UUID", s))
		return uuid.Nil
	}
	id, err := uuid.ParseBytes(s)
	if err != nil {
		panic(err) // canonicalID checked the form
	}
	return id
}

// canonicalID reports whether s has the form the schema's id pattern
// allows, ^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$:
// hyphens at 8, 13, 18 and 23 and lower-case hex digits elsewhere, checked
// byte by byte because every event has several ids.
func canonicalID(s []byte) bool {
	if len(s) != 36 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

func (d *fields) time(name string) time.Time {
	s, ok := d.str(name)
	if !ok {
		return time.Time{}
	}
	if !timeForm.Match(s) {
		d.bad(name, fmt.Sprintf("%q is not an RFC 3339 date-time (upper-case T and Z, at most 9 fraction digits, a year from 0001, a UTC offset within ±15:59)", s))
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, string(s))
	if err != nil {
		d.bad(name, fmt.Sprintf("%q is not a date-time: %v", s, err))
	}
	return t
}

// integer reads a JSON number with no fraction within int64 (Validate checks
// the field's own range): 50, 50.0 and 5e1 are all 50, as JSON Schema's
// "integer" has it.
func (d *fields) integer(name string) int64 {
	raw := d.member(name, "a number", isNumber)
	if raw == nil {
		return 0
	}
	// The usual form, digits alone, without big.Rat; 50.0, 5e1 and numbers
	// past int64 take the exact path below.
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n
	}
	n, ok := new(big.Rat).SetString(string(raw))
	switch {
	case !ok || !n.IsInt():
		d.bad(name, fmt.Sprintf("%s is not an integer", raw))
		return 0
	case !n.Num().IsInt64():
		d.bad(name, fmt.Sprintf("%s is out of range", raw))
		return 0
	}
	return n.Num().Int64()
}

func (d *fields) targets(name string) []Target {
	raw := d.member(name, "an array", isArray)
	if raw == nil {
		return nil
	}
	var out []Target
	var buf [4]member
	splitArray(raw, func(item []byte) {
		i := len(out)
		obj, ok := splitObject(item, buf[:0])
		if !ok {
			d.bad(fmt.Sprintf("%s[%d]", name, i), "must be an object")
			out = append(out, Target{})
			return
		}
		t := fields{obj: obj, list: name, item: i}
		kind := t.enum("TargetKind", string(TargetProject), string(TargetPropertyObject), string(TargetPost))
		out = append(out, Target{TargetKind: TargetKind(kind), TargetId: t.id("TargetId")})
		d.errs = append(d.errs, t.errs...)
	})
	if out == nil {
		out = []Target{}
	}
	return out
}

// failed reports whether field, or the member that holds it, failed to decode.
func (d *fields) failed(field string) bool {
	for _, err := range d.errs {
		f := err.(*ContractError).Field
		if field == f || strings.HasPrefix(field, f+".") || strings.HasPrefix(field, f+"[") {
			return true
		}
	}
	return false
}

// joinViolations is one *ContractError that names the first violation's
// field and lists every violation once, one a line: "contract violation:
// TenantId: is required\nPackageKind: is required".
func joinViolations(errs []error) error {
	var first *ContractError
	errors.As(errs[0], &first)
	if len(errs) == 1 {
		return first
	}
	details := make([]string, 0, len(errs))
	for _, err := range errs {
		var ce *ContractError
		if errors.As(err, &ce) {
			details = append(details, ce.detail())
		} else {
			details = append(details, err.Error())
		}
	}
	return &ContractError{Field: first.Field, Reason: strings.Join(details, "\n"), joined: true}
}
