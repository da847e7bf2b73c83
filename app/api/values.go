package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// The request values whose JSON form the documents narrow further than
// encoding/json does, or whose range is the column's. Each type accepts
// exactly what its schema in the OpenAPI documents accepts (the patterns here
// are the documents'), so that the API and its documents agree both ways: a
// value of another type or form is an error (400), one of the right form
// that breaks a stated rule a *brokenRule (422).

// brokenRule is a value of the documented type and form that breaks a rule
// the document states: a bound, PostgreSQL numeric's range, no U+0000.
type brokenRule struct{ problem string }

func (e *brokenRule) Error() string { return e.problem }

// orForm keeps a broken rule and names any other error by the form wanted.
func orForm(err error, form string) error {
	var broken *brokenRule
	if errors.As(err, &broken) {
		return err
	}
	return errors.New(form)
}

// integer is a JSON number whose value is whole: 5, and also 5.0 or 5e0,
// which JSON Schema's "integer" accepts and encoding/json refuses for an int.
type integer int64

func (n *integer) UnmarshalJSON(b []byte) error {
	num, err := parseNumber(string(b))
	if err != nil {
		return orForm(err, "not an integer")
	}
	if num.intDigits() > 19 {
		return &brokenRule{"must be within -9223372036854775808..9223372036854775807"}
	}
	whole := num.digits[:min(max(num.point, 0), len(num.digits))]
	if strings.Trim(num.digits[len(whole):], "0") != "" {
		return errors.New("not an integer")
	}
	whole += strings.Repeat("0", max(0, num.point-len(num.digits)))
	v, err := strconv.ParseInt(num.sign+"0"+whole, 10, 64)
	if err != nil {
		return &brokenRule{"must be within -9223372036854775808..9223372036854775807"}
	}
	*n = integer(v)
	return nil
}

// value is the integer, 0 for none.
func (n *integer) value() int64 {
	if n == nil {
		return 0
	}
	return int64(*n)
}

// decimalPattern is the form of a decimal: JSON's number grammar with at
// most 1000 digits on either side of the point and a three-digit exponent.
// Every such value is within PostgreSQL numeric's range (131072 digits
// before the point, 16383 after), and its answer, at most 1999 digits on
// either side, is one that JSON parsers read (Python's refuses integers of
// more than 4300 digits). The document states it as the pattern of the
// string form; for a number it is a rule (422), a JSON Schema cannot see a
// number's digits.
var decimalPattern = regexp.MustCompile(`^-?(0|[1-9][0-9]{0,999})(\.[0-9]{1,1000})?([eE][+-]?[0-9]{1,3})?$`)

// decimal is a JSON number or a string of decimalPattern, kept as its text.
type decimal string

func (d *decimal) UnmarshalJSON(b []byte) error {
	s := string(b)
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if !decimalPattern.MatchString(s) {
			return fmt.Errorf("%q is not a decimal in JSON's number form with at most 1000 digits on either side of the point and a three-digit exponent", truncate(s))
		}
	} else if !jsonNumber.MatchString(s) {
		return errors.New("not a number or a string that holds one")
	} else if !decimalPattern.MatchString(s) {
		return &brokenRule{"must have at most 1000 digits on either side of the point and a three-digit exponent"}
	}
	*d = decimal(s)
	return nil
}

// str is the decimal's text, nil for none.
func (d *decimal) str() *string {
	if d == nil {
		return nil
	}
	s := string(*d)
	return &s
}

// number is a JSON number's parts, its exponent not yet applied.
type number struct {
	sign   string // "-" or ""
	digits string // the digits of the integer part, then those of the fraction
	point  int    // how many of digits come before the point once the exponent is applied
}

// maxExponent is the widest exponent an integer is read with: 0e1000000
// is 0, and wider ones are refused before they cost anything.
const maxExponent = 1000000

var jsonNumber = regexp.MustCompile(`^(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?$`)

// parseNumber reads a number of JSON's grammar without expanding it: 1e999999
// is a handful of bytes however many zeros it stands for.
func parseNumber(s string) (number, error) {
	m := jsonNumber.FindStringSubmatch(s)
	if m == nil {
		return number{}, fmt.Errorf("%q is not a number", truncate(s))
	}
	exp := 0
	if m[4] != "" {
		e, err := strconv.Atoi(m[4])
		if err != nil || e > maxExponent || e < -maxExponent {
			return number{}, &brokenRule{fmt.Sprintf("must have an exponent within ±%d", maxExponent)}
		}
		exp = e
	}
	return number{sign: m[1], digits: m[2] + m[3], point: len(m[2]) + exp}, nil
}

// intDigits is how many digits the number has before its point, leading
// zeros aside.
func (n number) intDigits() int {
	lead := len(n.digits) - len(strings.TrimLeft(n.digits, "0"))
	if lead == len(n.digits) {
		return 0 // zero, whatever its exponent
	}
	return max(0, n.point-lead)
}

// text is a JSON string that PostgreSQL text holds: one without U+0000.
type text string

func (t *text) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("not a string")
	}
	if strings.ContainsRune(s, 0) {
		return &brokenRule{"must not contain U+0000, which PostgreSQL text cannot hold"}
	}
	*t = text(s)
	return nil
}

// dateTimePattern is the document's pattern of a date-time: RFC 3339 with a
// capital T and Z, no leap second and an offset within ±23:59, which RFC 3339
// and Go's time package read alike (Go alone also reads +24:00 and a comma).
var dateTimePattern = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)

// dateTime is a JSON string of dateTimePattern that names a real day.
type dateTime time.Time

func (t *dateTime) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("not a string")
	}
	parsed, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !dateTimePattern.MatchString(s) {
		return fmt.Errorf("%q is not an RFC 3339 date-time such as 2026-01-31T12:00:00Z", truncate(s))
	}
	*t = dateTime(parsed)
	return nil
}

// time is the date-time, the zero time for none.
func (t *dateTime) time() time.Time {
	if t == nil {
		return time.Time{}
	}
	return time.Time(*t)
}

// canonicalUUID is a JSON string that holds a UUID in its 36-character form, the
// documents' format uuid.
type canonicalUUID uuid.UUID

func (i *canonicalUUID) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("not a string")
	}
	u, err := parseID(s)
	if err != nil {
		return err
	}
	*i = canonicalUUID(u)
	return nil
}

// parseID reads a UUID in its 36-character form: uuid.Parse alone also reads
// 32 hex digits, braces and a urn:uuid: prefix, which format uuid refuses.
func parseID(s string) (uuid.UUID, error) {
	u, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return uuid.Nil, fmt.Errorf("%q is not a UUID such as 0b1e1c4e-5d6f-4a7b-8c9d-0e1f2a3b4c5d", truncate(s))
	}
	return u, nil
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	return s[:most] + "..."
}
