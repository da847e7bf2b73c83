// Package api is the HTTP face of the promotion context: the purchase API.
package api

import (
	"encoding/json"
	"net/http"

	"github.com/promoflow/promoflow/handlers/purchase"
)

// Error is the JSON body of every 4xx/5xx answer.
type Error struct {
	Code    string                `json:"code"`
	Message string                `json:"message"`
	Fields  []purchase.FieldError `json:"fields,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, status int, code, msg string, fields ...purchase.FieldError) {
	writeJSON(w, status, map[string]Error{"error": {Code: code, Message: msg, Fields: fields}})
}
