package api

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
)

// maxBody bounds a request body.
const maxBody = 64 << 10

// decodeBody reads the request body into into, a pointer to a request struct,
// or answers the problem and reports false: 400 malformed_json for a body
// that is not JSON or not the documented object (a member the document does
// not name, a value of another type, text after it), 422 not_an_object for
// JSON that is not an object (null, an array, a string, a number). Nothing
// is written before the body has been read whole.
func decodeBody(w http.ResponseWriter, r *http.Request, into any) bool {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed_json", fmt.Sprintf("request body unreadable or larger than %d bytes: %v", maxBody, err))
		return false
	}
	if !json.Valid(raw) {
		writeError(w, http.StatusBadRequest, "malformed_json", "request body is not one JSON value")
		return false
	}
	if raw = bytes.TrimSpace(raw); raw[0] != '{' {
		writeError(w, http.StatusUnprocessableEntity, "not_an_object", "request body must be a JSON object, not "+jsonKind(raw[0]))
		return false
	}
	err = strictUnmarshal(raw, into)
	var member *memberError
	var broken *brokenRule
	switch {
	case errors.As(err, &member) && errors.As(err, &broken):
		writeError(w, http.StatusUnprocessableEntity, "validation_failed", "the request is not valid",
			FieldError{Field: member.path(), Problem: broken.problem})
		return false
	case err != nil:
		writeError(w, http.StatusBadRequest, "malformed_json", "request body is not valid: "+err.Error())
		return false
	}
	return true
}

// memberError is the error of one member of a request object, inside which
// the error of a member of its own may be.
type memberError struct {
	name string
	err  error
}

func (e *memberError) Error() string { return e.name + ": " + e.err.Error() }
func (e *memberError) Unwrap() error { return e.err }

// path names the member as FieldError does: Targets.TargetId.
func (e *memberError) path() string {
	var inner *memberError
	if errors.As(e.err, &inner) {
		return e.name + "." + inner.path()
	}
	return e.name
}

// jsonKind names the JSON type of a value that starts with b.
func jsonKind(b byte) string {
	switch b {
	case 'n':
		return "null"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	default:
		return "a number"
	}
}

// strictUnmarshal decodes the JSON object raw into into, a pointer to a
// struct, member by member, so that an error names its member. It refuses a
// member that is not one of the fields' json names spelled exactly:
// encoding/json alone matches names in any case, so {"title": ...} would fill
// Title although the document names only "Title". A null is the zero value.
func strictUnmarshal(raw []byte, into any) error {
	if string(raw) == "null" {
		return nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return err
	}
	v := reflect.ValueOf(into).Elem()
	fields := fieldIndex(v.Type())
	for _, name := range slices.Sorted(maps.Keys(members)) {
		i, ok := fields[name]
		if !ok {
			return fmt.Errorf("unknown member %q", name)
		}
		if err := json.Unmarshal(members[name], v.Field(i).Addr().Interface()); err != nil {
			return &memberError{name: name, err: readable(err)}
		}
	}
	return nil
}

// fieldIndex maps the json names of a struct type's fields to their index.
func fieldIndex(t reflect.Type) map[string]int {
	index := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		index[cmp.Or(name, t.Field(i).Name)] = i
	}
	return index
}

// readable says what a type error of encoding/json expected in the
// document's words, without Go's type names.
func readable(err error) error {
	var typeErr *json.UnmarshalTypeError
	if !errors.As(err, &typeErr) {
		return err
	}
	want := map[reflect.Kind]string{reflect.String: "a string", reflect.Bool: "a boolean", reflect.Slice: "an array",
		reflect.Struct: "an object", reflect.Map: "an object"}[typeErr.Type.Kind()]
	return fmt.Errorf("a JSON %s is not %s", typeErr.Value, cmp.Or(want, typeErr.Type.String()))
}
