package event_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// previousSchemaFile is the last published version of the v1 schema. Replace
// it with the current one once a compatible change is released. A form that
// was narrowed as a bug fix (it took values no consumer could ever apply) is
// recorded in it, beside the form it replaces, under bugFixKey with a note.
var previousSchemaFile = filepath.Join("testdata", "purchase_changed.v1.schema.previous.json")

// bugFixKey holds, in a schema of the previous version, the forms (const,
// pattern, format, not) that replace its own as a bug fix, and a note that
// says why. The check accepts exactly those forms; any other change of them
// still breaks.
const bugFixKey = "x-narrowedAsABugFix"

// TestContract_SchemaChangeIsBackwardCompatible: the schema may grow, but a
// change that a producer or a consumer of the previous version would trip on
// fails: a required field removed (old consumers reject the new events) or
// added (the compacted topic still holds events without it), a field removed,
// or a type, enum, bound or form narrowed (the topic's older events fail).
func TestContract_SchemaChangeIsBackwardCompatible(t *testing.T) {
	prev, cur := loadSchema(t, previousSchemaFile), loadSchema(t, schemaFile)
	require.Empty(t, breakingChanges(prev, cur),
		"the v1 schema changed incompatibly: publish a new topic version instead")

	// The check sees each kind of change it is there to refuse.
	for name, change := range map[string]func(s map[string]any){
		"required field removed": func(s map[string]any) {
			s["required"] = slices.DeleteFunc(s["required"].([]any), func(v any) bool { return v == "TenantId" })
		},
		"required field added":  func(s map[string]any) { s["required"] = append(s["required"].([]any), "Currency") },
		"field removed":         func(s map[string]any) { delete(s["properties"].(map[string]any), "PackageKind") },
		"type narrowed":         func(s map[string]any) { prop(s, "PackageKind")["type"] = "integer" },
		"bound narrowed":        func(s map[string]any) { prop(s, "BoostWeight")["maximum"] = 50.0 },
		"enum narrowed":         func(s map[string]any) { prop(s, "Status")["enum"] = []any{"Active", "Expired", "Cancelled"} },
		"nested form narrowed":  func(s map[string]any) { def(s, "target")["additionalProperties"] = false },
		"minimum items raised":  func(s map[string]any) { prop(s, "Targets")["minItems"] = 2.0 },
		"new form on a field":   func(s map[string]any) { prop(s, "PaymentStatus")["pattern"] = "^[A-Z]" },
		"shared form narrowed":  func(s map[string]any) { def(s, "id")["pattern"] = "^[0-9a-f-]{36}$" },
		"integer type narrowed": func(s map[string]any) { prop(s, "Version")["type"] = "string" },
		"fixed form narrowed further": func(s map[string]any) {
			def(s, "time")["pattern"] = strings.Replace(def(s, "time")["pattern"].(string), "[1-9][0-9]{3}", "2[0-9]{3}", 1)
		},
		"fixed form on another field": func(s map[string]any) { prop(s, "PackageKind")["pattern"] = def(s, "time")["pattern"] },
		"new format on a fixed form":  func(s map[string]any) { def(s, "time")["format"] = "date" },
		"fixed bound lowered further": func(s map[string]any) { prop(s, "Targets")["maxItems"] = 11999.0 },
	} {
		t.Run(name, func(t *testing.T) {
			next := loadSchema(t, schemaFile)
			change(next)
			require.NotEmpty(t, breakingChanges(prev, next), "a breaking change passed")
		})
	}
}

func loadSchema(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var s map[string]any
	require.NoError(t, json.Unmarshal(raw, &s))
	return s
}

func prop(s map[string]any, name string) map[string]any {
	return s["properties"].(map[string]any)[name].(map[string]any)
}

func def(s map[string]any, name string) map[string]any {
	return s["$defs"].(map[string]any)[name].(map[string]any)
}

// breakingChanges lists where cur refuses what prev accepted or stops
// describing what prev required, walking both schemas from their roots.
func breakingChanges(prev, cur map[string]any) []string {
	c := compat{prevRoot: prev, curRoot: cur}
	c.compare("#", prev, cur)
	return c.found
}

type compat struct {
	prevRoot, curRoot map[string]any
	found             []string
}

func (c *compat) add(path, format string, args ...any) {
	c.found = append(c.found, path+": "+fmt.Sprintf(format, args...))
}

// resolve follows a local $ref ("#/$defs/id") to its schema.
func resolve(root, s map[string]any) map[string]any {
	ref, ok := s["$ref"].(string)
	if !ok {
		return s
	}
	target := any(root)
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		target = target.(map[string]any)[part]
	}
	merged := maps.Clone(target.(map[string]any))
	for k, v := range s {
		if k != "$ref" {
			merged[k] = v
		}
	}
	return merged
}

func (c *compat) compare(path string, prev, cur map[string]any) {
	prev, cur = resolve(c.prevRoot, prev), resolve(c.curRoot, cur)
	if types(cur) != nil && !subset(types(prev), types(cur)) {
		c.add(path, "type %v no longer takes %v", cur["type"], prev["type"])
	}
	if enum, ok := cur["enum"].([]any); ok && !subset(asSlice(prev["enum"]), enum) {
		c.add(path, "enum %v no longer takes %v", enum, prev["enum"])
	}
	fixed, _ := prev[bugFixKey].(map[string]any)
	for _, key := range []string{"const", "pattern", "format", "not"} {
		if v, ok := cur[key]; ok && !reflect.DeepEqual(prev[key], v) && !reflect.DeepEqual(fixed[key], v) {
			c.add(path, "%s is now %v (was %v)", key, v, prev[key])
		}
	}
	for _, key := range []string{"minimum", "exclusiveMinimum", "minLength", "minItems"} {
		if v, ok := cur[key].(float64); ok {
			if was, ok := prev[key].(float64); !ok || v > was {
				c.add(path, "%s raised to %v (was %v)", key, v, prev[key])
			}
		}
	}
	for _, key := range []string{"maximum", "exclusiveMaximum", "maxLength", "maxItems"} {
		if v, ok := cur[key].(float64); ok {
			if was, ok := prev[key].(float64); (!ok || v < was) && !reflect.DeepEqual(fixed[key], v) {
				c.add(path, "%s lowered to %v (was %v)", key, v, prev[key])
			}
		}
	}
	if cur["additionalProperties"] == false && prev["additionalProperties"] != false {
		c.add(path, "no longer takes unknown fields")
	}
	was, now := asSlice(prev["required"]), asSlice(cur["required"])
	for _, name := range was {
		if !slices.Contains(now, name) {
			c.add(path, "%v is no longer required", name)
		}
	}
	for _, name := range now {
		if !slices.Contains(was, name) {
			c.add(path, "%v is newly required", name)
		}
	}
	prevProps, _ := prev["properties"].(map[string]any)
	curProps, _ := cur["properties"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(prevProps)) {
		next, ok := curProps[name].(map[string]any)
		if !ok {
			c.add(path, "%s was removed", name)
			continue
		}
		c.compare(path+"/properties/"+name, prevProps[name].(map[string]any), next)
	}
	if items, ok := cur["items"].(map[string]any); ok {
		before, _ := prev["items"].(map[string]any)
		c.compare(path+"/items", before, items)
	}
}

// types is a schema's "type" as a set; "integer" is within "number".
func types(s map[string]any) []any {
	switch t := s["type"].(type) {
	case string:
		return []any{t}
	case []any:
		return t
	}
	return nil
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// subset reports whether every value of a is in b (no a means anything, which
// only a missing b takes).
func subset(a, b []any) bool {
	if a == nil {
		return b == nil
	}
	for _, v := range a {
		if !slices.Contains(b, v) && !(v == "integer" && slices.Contains(b, any("number"))) {
			return false
		}
	}
	return true
}
