package router_test

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"
	"go.yaml.in/yaml/v3"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/dlqreplay"
)

// asyncAPIFile describes the topics, headers and consumer groups of the code.
var asyncAPIFile = filepath.Join("..", "docs", "contracts", "asyncapi.yaml")

// headerSources are the packages whose Header* constants name Kafka record
// headers: the contract's, and the dead letters' and replays'.
var headerSources = map[string]string{"event": filepath.Join("..", "handlers", "event"), "deadLetter": filepath.Join("..", "middleware")}

// TestAsyncAPI_DocumentIsValid: docs/contracts/asyncapi.yaml is a valid
// AsyncAPI 3.0 document whose payload is the published JSON Schema, and its
// topics, headers and consumer groups are exactly the code's: every one the
// code uses is in the document, and every one in the document is the code's.
func TestAsyncAPI_DocumentIsValid(t *testing.T) {
	t.Parallel()
	doc := loadYAMLAsJSON(t, asyncAPIFile)
	schema := jsonschema.NewCompiler()
	spec, err := schema.Compile(filepath.Join("testdata", "asyncapi-3.0.0", "schema.json"))
	require.NoError(t, err)
	require.NoError(t, spec.Validate(doc), "not an AsyncAPI 3.0 document")

	// The payload is the JSON Schema next to the contract's type, and the
	// producer's messages match it.
	ref := dig(t, doc, "components", "messages", "PurchaseChanged", "payload", "schema", "$ref").(string)
	require.Equal(t, "../../handlers/event/purchase_changed.v1.schema.json", ref)
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	payload, err := c.Compile(filepath.Join(filepath.Dir(asyncAPIFile), ref))
	require.NoError(t, err)
	msg, err := event.NewMessage(catalogTestEvent(), "corr-1", time.Now())
	require.NoError(t, err)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(msg.Payload))
	require.NoError(t, err)
	require.NoError(t, payload.Validate(inst))

	// Topics.
	var addresses []string
	for _, ch := range dig(t, doc, "channels").(map[string]any) {
		addresses = append(addresses, ch.(map[string]any)["address"].(string))
	}
	require.ElementsMatch(t, []string{event.Topic, middleware.DLQTopicDefault, dlqreplay.ReplayTopicDefault}, addresses)

	// Consumer groups: each group of the code is one a receiving operation
	// names, and each receiving operation names one of the code's.
	groups := []string{router.CatalogConsumerGroup, router.CatalogConsumerGroup + router.ReplayGroupSuffix, dlqreplay.GroupPrefix}
	matched := map[string]bool{}
	for name, op := range dig(t, doc, "operations").(map[string]any) {
		if op.(map[string]any)["action"] != "receive" {
			continue
		}
		groupID := compileInline(t, dig(t, op, "bindings", "kafka", "groupId"))
		found := false
		for _, g := range groups {
			if groupID.Validate(g) == nil {
				found, matched[g] = true, true
			}
		}
		require.True(t, found, "operation %s names a group the code does not use", name)
	}
	for _, g := range groups {
		require.True(t, matched[g], "consumer group %s is not in the document", g)
	}

	// Headers: the contract's on the purchase topic (as watermill-kafka
	// writes them), and every one of them plus the DLQ's on the DLQ and the
	// replay topic.
	// The trace context's headers (event.TraceHeaders) are the propagators'.
	eventHeaders := append(constants(t, headerSources["event"], "Header"), kafka.UUIDHeaderKey)
	eventHeaders = append(eventHeaders, event.TraceHeaders...)
	event.InjectTrace(tracedContext(t), msg)
	record, err := kafka.DefaultMarshaler{}.Marshal(event.Topic, msg)
	require.NoError(t, err)
	var written []string
	for _, h := range record.Headers {
		written = append(written, string(h.Key))
	}
	require.ElementsMatch(t, eventHeaders, written, "the headers of a record the relay writes")
	deadLetterHeaders := append(slices.Clone(eventHeaders), constants(t, headerSources["deadLetter"], "Header")...)
	for message, want := range map[string][]string{"PurchaseChanged": eventHeaders, "DeadLetter": deadLetterHeaders, "Replay": deadLetterHeaders} {
		ref := dig(t, doc, "components", "messages", message, "headers", "$ref").(string)
		props := dig(t, doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...).(map[string]any)["properties"].(map[string]any)
		var documented []string
		for h := range props {
			documented = append(documented, h)
		}
		require.ElementsMatch(t, want, documented, "the headers of message %s", message)
	}
}

// loadYAMLAsJSON reads a YAML file into the values a JSON decoder gives.
func loadYAMLAsJSON(t *testing.T, path string) any {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var v any
	require.NoError(t, yaml.Unmarshal(raw, &v))
	asJSON, err := json.Marshal(v)
	require.NoError(t, err)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(asJSON))
	require.NoError(t, err)
	return doc
}

func dig(t *testing.T, v any, path ...string) any {
	t.Helper()
	for _, p := range path {
		m, ok := v.(map[string]any)
		require.True(t, ok, "%s: not an object", p)
		v, ok = m[p]
		require.True(t, ok, "%s: missing", p)
	}
	return v
}

// compileInline compiles a schema written inside the document.
func compileInline(t *testing.T, s any) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("inline.json", s))
	schema, err := c.Compile("inline.json")
	require.NoError(t, err)
	return schema
}

// constants are the string values of the constants of the package in dir
// whose names start with prefix.
func constants(t *testing.T, dir, prefix string) []string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	require.NoError(t, err)
	var out []string
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, decl := range f.Decls {
				gen, ok := decl.(*ast.GenDecl)
				if !ok || gen.Tok != token.CONST {
					continue
				}
				for _, spec := range gen.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if i >= len(vs.Values) {
							break // an iota run's later names repeat the first's expression
						}
						lit, ok := vs.Values[i].(*ast.BasicLit)
						if !strings.HasPrefix(name.Name, prefix) || !ok || lit.Kind != token.STRING {
							continue
						}
						v, err := strconv.Unquote(lit.Value)
						require.NoError(t, err)
						out = append(out, v)
					}
				}
			}
		}
	}
	require.NotEmpty(t, out, "no %s constants in %s", prefix, dir)
	return out
}

func catalogTestEvent() event.PurchaseChanged {
	return event.PurchaseChanged{PurchaseId: uuid.New(), TenantId: uuid.New(), PackageKind: "Top",
		Targets:     []event.Target{{TargetKind: event.TargetProject, TargetId: uuid.New()}},
		BoostWeight: 10, Status: event.StatusActive, PaymentStatus: "NotRequired",
		StartsAt: time.Now().UTC(), EndsAt: time.Now().Add(time.Hour).UTC(), Version: 1}
}

// tracedContext holds a sampled span context with a tracestate and a baggage
// member, as a writer's request may have them.
func tracedContext(t *testing.T) context.Context {
	t.Helper()
	state, err := trace.ParseTraceState("vendor=value")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1},
		TraceFlags: trace.FlagsSampled, TraceState: state})
	member, err := baggage.NewMember("tenant", "t1")
	require.NoError(t, err)
	bag, err := baggage.New(member)
	require.NoError(t, err)
	return baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), bag)
}
