package event

import (
	"bytes"
	"encoding/json"
)

// member is one name and raw value of a JSON object.
type member struct {
	name, raw []byte
}

// object is the members of one JSON object, in the order written.
type object []member

// get returns the raw value of name; of a name written twice, the last one
// counts, as encoding/json decodes it into a map.
func (o object) get(name string) ([]byte, bool) {
	for i := len(o) - 1; i >= 0; i-- {
		if string(o[i].name) == name {
			return o[i].raw, true
		}
	}
	return nil, false
}

// splitObject appends to into the members of the JSON object b holds, with
// each name unescaped as encoding/json unescapes it and each value's bytes as
// written; ok is false when b holds another JSON value. b must be valid JSON
// (json.Valid): the scan relies on it and checks nothing.
func splitObject(b []byte, into object) (o object, ok bool) {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return nil, false
	}
	o = into[:0]
	if i = skipSpace(b, i+1); b[i] == '}' {
		return o, true
	}
	for {
		end := skipString(b, i)
		name := b[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			var s string
			_ = json.Unmarshal(b[i:end], &s) // valid: it cannot fail
			name = []byte(s)
		}
		i = skipSpace(b, skipSpace(b, end)+1) // past the colon
		end = skipValue(b, i)
		o = append(o, member{name: name, raw: b[i:end]})
		if i = skipSpace(b, end); b[i] == '}' {
			return o, true
		}
		i = skipSpace(b, i+1) // past the comma
	}
}

// splitArray calls fn with each item of the JSON array b holds (valid JSON,
// its first byte '[').
func splitArray(b []byte, fn func(item []byte)) {
	i := skipSpace(b, 1)
	if b[i] == ']' {
		return
	}
	for {
		end := skipValue(b, i)
		fn(b[i:end])
		if i = skipSpace(b, end); b[i] == ']' {
			return
		}
		i = skipSpace(b, i+1)
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index past the string that starts at b[i].
func skipString(b []byte, i int) int {
	for i++; ; i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

// skipValue returns the index past the value that starts at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
	default: // a number, true, false or null
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' &&
			b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
			i++
		}
		return i
	}
}
