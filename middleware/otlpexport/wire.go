package otlpexport

import (
	"math"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// The OTLP field numbers this file writes (opentelemetry/proto/trace/v1,
// common/v1 and resource/v1).
const (
	resourceSpansResource, resourceSpansScopeSpans, resourceSpansSchemaURL = 1, 2, 3
	scopeSpansScope, scopeSpansSpans, scopeSpansSchemaURL                  = 1, 2, 3
	scopeName, scopeVersion, scopeAttributes                               = 1, 2, 3
	resourceAttributes                                                     = 1

	spanTraceID, spanSpanID, spanTraceState, spanParentSpanID, spanName, spanKind = 1, 2, 3, 4, 5, 6
	spanStart, spanEnd, spanAttributes, spanDroppedAttributes                     = 7, 8, 9, 10
	spanEvents, spanDroppedEvents, spanLinks, spanDroppedLinks, spanStatus        = 11, 12, 13, 14, 15
	spanFlags                                                                     = 16

	eventTime, eventName, eventAttributes, eventDroppedAttributes  = 1, 2, 3, 4
	linkTraceID, linkSpanID, linkAttributes, linkDroppedAttributes = 1, 2, 4, 5
	linkFlags                                                      = 6
	statusMessage, statusCode                                      = 2, 3

	keyValueKey, keyValueValue                              = 1, 2
	anyString, anyBool, anyInt, anyDouble, anyArray, anyKVs = 1, 2, 3, 4, 5, 6
	anyBytes                                                = 7
	listValues                                              = 1

	// flagHasIsRemote and flagIsRemote are SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
	// and SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK.
	flagHasIsRemote, flagIsRemote = 0x100, 0x200
)

// group is the spans of one resource and instrumentation scope, in the
// order they came.
type group struct {
	res   *resource.Resource
	key   attribute.Distinct
	scope instrumentation.Scope
	spans []sdktrace.ReadOnlySpan
}

// groupSpans sorts spans into groups by resource and scope, reusing gs:
// the resources in the order they came, and in each its scopes in the order
// they came.
func groupSpans(gs []group, spans []sdktrace.ReadOnlySpan) []group {
	for i := range gs {
		clear(gs[i].spans)
		gs[i].spans = gs[i].spans[:0]
	}
	gs = gs[:0]
next:
	for _, s := range spans {
		if s == nil {
			continue
		}
		key, scope := s.Resource().Equivalent(), s.InstrumentationScope()
		for i := range gs {
			if gs[i].key == key && gs[i].scope == scope {
				gs[i].spans = append(gs[i].spans, s)
				continue next
			}
		}
		if len(gs) < cap(gs) {
			gs = gs[:len(gs)+1]
		} else {
			gs = append(gs, group{})
		}
		// A resource's groups stay together: the new one goes after the
		// last of its resource.
		at := len(gs) - 1
		for i := len(gs) - 2; i >= 0; i-- {
			if gs[i].key == key {
				at = i + 1
				break
			}
		}
		slot := gs[len(gs)-1]
		copy(gs[at+1:], gs[at:len(gs)-1])
		slot.res, slot.key, slot.scope, slot.spans = s.Resource(), key, scope, append(slot.spans, s)
		gs[at] = slot
	}
	return gs
}

// appendResourceSpans appends the content of one ResourceSpans message
// (without its own tag and length): res, and the groups of gs, which all
// have res's key.
func appendResourceSpans(b []byte, res *resource.Resource, gs []group) []byte {
	if res != nil {
		at := 0
		b, at = open(b, resourceSpansResource)
		for it := res.Iter(); it.Next(); {
			b = appendKeyValue(b, resourceAttributes, it.Attribute())
		}
		b = closeAt(b, at)
	}
	for _, g := range gs {
		at := 0
		b, at = open(b, resourceSpansScopeSpans)
		b = appendScopeSpans(b, g)
		b = closeAt(b, at)
	}
	if res != nil {
		b = appendString(b, resourceSpansSchemaURL, res.SchemaURL())
	}
	return b
}

func appendScopeSpans(b []byte, g group) []byte {
	if g.scope != (instrumentation.Scope{}) {
		at := 0
		b, at = open(b, scopeSpansScope)
		b = appendString(b, scopeName, g.scope.Name)
		b = appendString(b, scopeVersion, g.scope.Version)
		for it := g.scope.Attributes.Iter(); it.Next(); {
			b = appendKeyValue(b, scopeAttributes, it.Attribute())
		}
		b = closeAt(b, at)
	}
	for _, s := range g.spans {
		at := 0
		b, at = open(b, scopeSpansSpans)
		b = appendSpan(b, s)
		b = closeAt(b, at)
	}
	return appendString(b, scopeSpansSchemaURL, g.scope.SchemaURL)
}

// appendSpan writes one span as the OTLP exporter's transform of it
// decodes: the same fields, flags and zero values.
func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, spanTraceID, tid[:])
	b = appendBytes(b, spanSpanID, sid[:])
	b = appendString(b, spanTraceState, sc.TraceState().String())
	parent := s.Parent()
	if psid := parent.SpanID(); psid.IsValid() {
		b = appendBytes(b, spanParentSpanID, psid[:])
	}
	b = appendString(b, spanName, s.Name())
	b = appendVarint(b, spanKind, uint64(kindOf(s.SpanKind())))
	b = appendFixed64(b, spanStart, unixNano(s.StartTime().UnixNano()))
	b = appendFixed64(b, spanEnd, unixNano(s.EndTime().UnixNano()))
	for _, kv := range s.Attributes() {
		b = appendKeyValue(b, spanAttributes, kv)
	}
	b = appendVarint(b, spanDroppedAttributes, clampUint32(s.DroppedAttributes()))
	for _, e := range s.Events() {
		at := 0
		b, at = open(b, spanEvents)
		b = appendFixed64(b, eventTime, unixNano(e.Time.UnixNano()))
		b = appendString(b, eventName, e.Name)
		for _, kv := range e.Attributes {
			b = appendKeyValue(b, eventAttributes, kv)
		}
		b = appendVarint(b, eventDroppedAttributes, clampUint32(e.DroppedAttributeCount))
		b = closeAt(b, at)
	}
	b = appendVarint(b, spanDroppedEvents, clampUint32(s.DroppedEvents()))
	for _, l := range s.Links() {
		at := 0
		b, at = open(b, spanLinks)
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = appendBytes(b, linkTraceID, ltid[:])
		b = appendBytes(b, linkSpanID, lsid[:])
		for _, kv := range l.Attributes {
			b = appendKeyValue(b, linkAttributes, kv)
		}
		b = appendVarint(b, linkDroppedAttributes, clampUint32(l.DroppedAttributeCount))
		b = protowire.AppendTag(b, linkFlags, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, flags(l.SpanContext.TraceFlags(), l.SpanContext))
		b = closeAt(b, at)
	}
	b = appendVarint(b, spanDroppedLinks, clampUint32(s.DroppedLinks()))
	st := s.Status()
	at := 0
	b, at = open(b, spanStatus)
	b = appendString(b, statusMessage, st.Description)
	b = appendVarint(b, statusCode, statusCodeOf(st.Code))
	b = closeAt(b, at)
	b = protowire.AppendTag(b, spanFlags, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, flags(sc.TraceFlags(), parent))
}

// flags are a span's or a link's OTLP flags: the W3C trace flags, and
// whether the parent (or the linked context) is remote.
func flags(tf trace.TraceFlags, parent trace.SpanContext) uint32 {
	f := uint32(tf) | flagHasIsRemote
	if parent.IsRemote() {
		f |= flagIsRemote
	}
	return f
}

// kindOf is SpanKind's OTLP number (SPAN_KIND_INTERNAL is 1, as the SDK's
// SpanKindInternal); an unknown kind is SPAN_KIND_UNSPECIFIED.
func kindOf(k trace.SpanKind) trace.SpanKind {
	if k < trace.SpanKindInternal || k > trace.SpanKindConsumer {
		return trace.SpanKindUnspecified
	}
	return k
}

// statusCodeOf is the OTLP STATUS_CODE_* of c: UNSET 0, OK 1, ERROR 2.
func statusCodeOf(c codes.Code) uint64 {
	switch c {
	case codes.Ok:
		return 1
	case codes.Error:
		return 2
	}
	return 0
}

func appendKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	at := 0
	b, at = open(b, num)
	b = appendString(b, keyValueKey, string(kv.Key))
	b = appendValue(b, keyValueValue, kv.Value)
	return closeAt(b, at)
}

// appendValue writes v as an AnyValue field. Its oneof member is written
// even when zero, as protobuf does for a set oneof.
func appendValue(b []byte, num protowire.Number, v attribute.Value) []byte {
	at := 0
	b, at = open(b, num)
	switch v.Type() {
	case attribute.BOOL:
		b = protowire.AppendTag(b, anyBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, anyInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, anyDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		b = protowire.AppendTag(b, anyString, protowire.BytesType)
		b = protowire.AppendString(b, v.AsString())
	case attribute.BYTESLICE:
		b = protowire.AppendTag(b, anyBytes, protowire.BytesType)
		b = protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		b = appendList(b, v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		b = appendList(b, v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		b = appendList(b, v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		b = appendList(b, v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		b = appendList(b, v.AsSlice(), func(v attribute.Value) attribute.Value { return v })
	case attribute.MAP:
		inner := 0
		b, inner = open(b, anyKVs)
		for _, kv := range v.AsMap() {
			b = appendKeyValue(b, listValues, kv)
		}
		b = closeAt(b, inner)
	case attribute.EMPTY:
	default:
		b = protowire.AppendTag(b, anyString, protowire.BytesType)
		b = protowire.AppendString(b, "INVALID")
	}
	return closeAt(b, at)
}

// appendList writes vs as an AnyValue's array_value.
func appendList[T any](b []byte, vs []T, value func(T) attribute.Value) []byte {
	at := 0
	b, at = open(b, anyArray)
	for _, v := range vs {
		b = appendValue(b, listValues, value(v))
	}
	return closeAt(b, at)
}

// open appends the tag of the length-delimited field num and one byte for
// its length, and returns where its content starts; closeAt writes the
// length once the content is there.
func open(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = append(b, 0)
	return b, len(b)
}

// closeAt writes the length of the content that starts at at, moving the
// content on when the length takes more than the one byte open reserved.
func closeAt(b []byte, at int) []byte {
	n := len(b) - at
	if size := protowire.SizeVarint(uint64(n)); size > 1 {
		for range size - 1 {
			b = append(b, 0)
		}
		copy(b[at+size-1:], b[at:at+n])
	}
	protowire.AppendVarint(b[:at-1], uint64(n))
	return b
}

// The proto3 scalar fields below are left out when zero, as protobuf does.

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func unixNano(ns int64) uint64 { return uint64(max(0, ns)) }

func clampUint32(v int) uint64 { return uint64(min(max(v, 0), math.MaxUint32)) }
