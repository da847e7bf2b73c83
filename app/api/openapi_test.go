package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	legacyrouter "github.com/getkin/kin-openapi/routers/legacy"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

// The OpenAPI documents the processes serve at GET /openapi.json.
const (
	promotionDocument = "promotion"
	catalogDocument   = "catalog"
)

func documentFile(name string) string { return filepath.Join("openapi", name+".json") }

// loadDocument loads and validates one OpenAPI 3.1 document.
func loadDocument(t testing.TB, name string) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(documentFile(name))
	require.NoError(t, err)
	require.NoError(t, doc.Validate(loader.Context), "%s is not a valid OpenAPI document", name)
	return doc
}

// reporter is where a contract reports a violation: the test, or a recorder
// in the test of the contract itself.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// contract checks every request a test server takes and every answer it
// gives against an OpenAPI document: an answer's status, headers and body
// must be documented for its operation, and a request the document refuses
// must be refused (4xx) by the API too.
type contract struct {
	report reporter
	router routers.Router
}

// The documents' format uuid is RFC 9562's string form, of any version:
// kin-openapi asserts no format it has no validator of.
func init() {
	openapi3.DefineStringFormatValidator("uuid", openapi3.NewRegexpFormatValidator(
		`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`))
}

func newContract(t testing.TB, name string, report reporter) *contract {
	t.Helper()
	doc := loadDocument(t, name)
	doc.Servers = openapi3.Servers{{URL: "/"}} // the test server's address, whatever it is
	router, err := legacyrouter.NewRouter(doc)
	require.NoError(t, err)
	return &contract{report: report, router: router}
}

// validatedServer is an httptest server of h whose every exchange c checks.
func validatedServer(t testing.TB, name string, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(newContract(t, name, t).wrap(h))
	t.Cleanup(srv.Close)
	return srv
}

// wrap serves h and checks each exchange.
func (c *contract) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			c.report.Errorf("%s %s: read the request: %v", r.Method, r.URL, err)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, withBody(r, body))
		for _, problem := range c.check(withBody(r, body), rec) {
			c.report.Errorf("%s %s → %d: %s", r.Method, r.URL, rec.Code, problem)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

func withBody(r *http.Request, body []byte) *http.Request {
	out := r.Clone(r.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	return out
}

// undocumentedHeaders are the headers of every HTTP answer, which no
// document lists (Content-Type is the media type of the body's content).
var undocumentedHeaders = map[string]bool{"Content-Type": true, "Content-Length": true, "Date": true,
	"Transfer-Encoding": true, "Connection": true}

// check lists what in one exchange the document does not describe.
func (c *contract) check(r *http.Request, rec *httptest.ResponseRecorder) []string {
	route, params, err := c.router.FindRoute(r)
	if err != nil {
		return []string{"the route is not in the document: " + err.Error()}
	}
	ctx := context.Background()
	in := &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route,
		Options: &openapi3filter.Options{MultiError: true, AuthenticationFunc: bearerPresent}}
	var problems []string
	err = openapi3filter.ValidateRequest(ctx, in)
	if err != nil && (rec.Code < 400 || rec.Code > 499) {
		problems = append(problems, fmt.Sprintf("the document refuses the request, the API did not: %v", err))
	}
	// 400 says the request is not what the document describes; a rule the
	// document states in words is a 422.
	if err == nil && rec.Code == http.StatusBadRequest {
		problems = append(problems, fmt.Sprintf("the document accepts the request, the API answered 400: %s", rec.Body))
	}
	err = openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: rec.Code, Header: rec.Header(),
		Body:    io.NopCloser(bytes.NewReader(rec.Body.Bytes())),
		Options: &openapi3filter.Options{MultiError: true, IncludeResponseStatus: true},
	})
	if err != nil {
		return append(problems, fmt.Sprintf("the answer is not the documented one: %v", err))
	}
	documented := route.Operation.Responses.Status(rec.Code).Value.Headers
	for name := range rec.Header() {
		if undocumentedHeaders[name] {
			continue
		}
		found := false
		for d := range documented {
			found = found || strings.EqualFold(d, name)
		}
		if !found {
			problems = append(problems, fmt.Sprintf("header %s is not documented for status %d", name, rec.Code))
		}
	}
	return problems
}

// bearerPresent meets a bearer security requirement when the request carries
// a bearer token; whether the API knows it is the API's answer.
func bearerPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	token, ok := strings.CutPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return in.NewError(fmt.Errorf("no bearer token"))
	}
	return nil
}

// recorded collects violations instead of failing the test.
type recorded struct {
	mu   sync.Mutex
	errs []string
}

func (r *recorded) Helper() {}

func (r *recorded) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestOpenAPI_EveryAPIResponseMatchesTheDocument: both documents are valid
// OpenAPI 3.1, each process serves its own at GET /openapi.json, and the
// contract that wraps the server of every API test (setup,
// setupCatalogAPI) refuses an undocumented status, header or field.
func TestOpenAPI_EveryAPIResponseMatchesTheDocument(t *testing.T) {
	t.Parallel()
	for name, b := range map[string]apiBundle{promotionDocument: newPromotionAPI(t), catalogDocument: newCatalogAPI(t)} {
		want, err := os.ReadFile(documentFile(name))
		require.NoError(t, err)
		resp, err := http.Get(b.srv.URL + "/openapi.json")
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, string(want), string(got), "GET /openapi.json serves %s", documentFile(name))
		requireOpenAPI31(t, want)
	}

	// What every process serves alike is described alike in both documents.
	promotion, catalog := loadDocument(t, promotionDocument), loadDocument(t, catalogDocument)
	same := func(a, b any, what string) {
		ja, err := json.Marshal(a)
		require.NoError(t, err)
		jb, err := json.Marshal(b)
		require.NoError(t, err)
		require.JSONEq(t, string(ja), string(jb), what)
	}
	for _, name := range []string{"Problem", "FieldError", "Health"} {
		same(promotion.Components.Schemas[name], catalog.Components.Schemas[name], "schema "+name)
	}
	for _, path := range []string{"/healthz", "/readyz", "/openapi.json"} {
		same(promotion.Paths.Value(path), catalog.Paths.Value(path), "path "+path)
	}

	// The contract itself: what it is there to refuse, it refuses.
	for what, tc := range map[string]struct {
		path   string
		answer func(w http.ResponseWriter)
		want   string
	}{
		"undocumented status": {"/promotions/" + tenantA.String(), func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusTeapot)
		}, "status is not supported"},
		"undocumented header": {"/openapi.json", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Debug", "1")
			_, _ = w.Write([]byte(`{}`))
		}, "header X-Debug is not documented"},
		"undocumented field": {"/promotions", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"items":[],"next":"abc"}`))
		}, `additional properties 'next' not allowed`},
		"undocumented media type": {"/promotions/" + tenantA.String(), func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusNotFound)
		}, "response header Content-Type has unexpected value"},
	} {
		t.Run(what, func(t *testing.T) {
			rec := &recorded{}
			srv := httptest.NewServer(newContract(t, promotionDocument, rec).wrap(http.HandlerFunc(
				func(w http.ResponseWriter, _ *http.Request) { tc.answer(w) })))
			defer srv.Close()
			req, err := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer token-a")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Len(t, rec.errs, 1)
			require.Contains(t, rec.errs[0], tc.want)
		})
	}
}

// requireOpenAPI31 validates doc against the official OpenAPI 3.1 JSON
// Schema, kept in testdata so that the check runs offline.
func requireOpenAPI31(t *testing.T, doc []byte) {
	t.Helper()
	c := jsonschema.NewCompiler()
	schema, err := c.Compile(filepath.Join("testdata", "openapi-3.1", "schema.json"))
	require.NoError(t, err)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	require.NoError(t, err)
	require.NoError(t, schema.Validate(inst), "not an OpenAPI 3.1 document")
}

// TestOpenAPI_LinksLeadFromAnAnswerToAnOperationThatTakesItsValue: a link
// names an operation of its document, fills exactly that operation's path
// parameters, and takes each value from where the answer or the request has
// it, a required member of the answer's body or a path parameter, so that a
// client (and Schemathesis' stateful phase) following it reaches a real
// purchase or card. Every operation that creates or stores has links.
func TestOpenAPI_LinksLeadFromAnAnswerToAnOperationThatTakesItsValue(t *testing.T) {
	t.Parallel()
	for name, want := range map[string][]string{
		promotionDocument: {"createPurchase 201", "createPurchase 200", "getPurchase 200", "cancelPurchase 200"},
		catalogDocument:   {"putProjectCard 200", "putPropertyObjectCard 200"},
	} {
		doc := loadDocument(t, name)
		type operation struct {
			item *openapi3.PathItem
			op   *openapi3.Operation
		}
		byID := map[string]operation{}
		for _, item := range doc.Paths.Map() {
			for _, op := range item.Operations() {
				byID[op.OperationID] = operation{item, op}
			}
		}
		var linked []string
		for path, item := range doc.Paths.Map() {
			for _, op := range item.Operations() {
				for status, resp := range op.Responses.Map() {
					for linkName, link := range resp.Value.Links {
						where := fmt.Sprintf("%s: %s %s link %s", name, op.OperationID, status, linkName)
						target, ok := byID[link.Value.OperationID]
						require.True(t, ok, "%s names no operation of the document", where)
						wantParams := pathParameters(target.item, target.op)
						require.ElementsMatch(t, wantParams, slices.Collect(maps.Keys(link.Value.Parameters)), "%s fills the path parameters", where)
						for _, expr := range link.Value.Parameters {
							member, fromBody := strings.CutPrefix(expr.(string), "$response.body#/")
							if fromBody {
								schema := resp.Value.Content.Get("application/json").Schema.Value
								require.Contains(t, schema.Required, member, "%s takes %s, which the answer does not always hold", where, expr)
								continue
							}
							param, fromPath := strings.CutPrefix(expr.(string), "$request.path.")
							require.True(t, fromPath, "%s: %s is neither a member of the body nor a path parameter", where, expr)
							require.Contains(t, pathParameters(item, op), param, "%s: %s", where, path)
						}
						linked = append(linked, op.OperationID+" "+status)
					}
				}
			}
		}
		for _, w := range want {
			require.Contains(t, linked, w, "%s: %s has no link", name, w)
		}
	}
}

// pathParameters names the path parameters of op, its own and its path's.
func pathParameters(item *openapi3.PathItem, op *openapi3.Operation) []string {
	var names []string
	for _, p := range append(slices.Clone(item.Parameters), op.Parameters...) {
		if p.Value.In == openapi3.ParameterInPath {
			names = append(names, p.Value.Name)
		}
	}
	return names
}
