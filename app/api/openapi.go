package api

import (
	_ "embed" // the OpenAPI documents
	"net/http"
)

// The OpenAPI 3.1 documents of the two APIs, served at GET /openapi.json by
// the process that serves the API (promoflow dev serves each on its port).
var (
	//go:embed openapi/promotion.json
	promotionDocument []byte
	//go:embed openapi/catalog.json
	catalogDocument []byte
)

// serveDocument answers GET /openapi.json with doc.
func serveDocument(mux *http.ServeMux, doc []byte) {
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	})
}
