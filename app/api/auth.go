package api

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
)

// Tokens maps bearer tokens to the tenant whose manager holds them.
type Tokens map[string]uuid.UUID

// ParseTokens reads "token=tenant-uuid,token2=tenant-uuid".
func ParseTokens(s string) (Tokens, error) {
	out := Tokens{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		token, tenant, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(token) == "" {
			return nil, fmt.Errorf("api token %q: want token=tenant-uuid", redact(pair))
		}
		id, err := uuid.Parse(strings.TrimSpace(tenant))
		if err != nil || id == uuid.Nil {
			return nil, fmt.Errorf("api token %s: tenant %q is not a UUID", redact(token), tenant)
		}
		out[strings.TrimSpace(token)] = id
	}
	return out, nil
}

func redact(s string) string {
	if len(s) <= 4 {
		return "****"
	}
	return s[:4] + "****"
}

var errUnauthorized = errors.New("unauthorized")

// tenant resolves the caller's tenant from its bearer token.
func (t Tokens) tenant(r *http.Request) (uuid.UUID, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return uuid.Nil, errUnauthorized
	}
	for known, tenant := range t {
		if subtle.ConstantTimeCompare([]byte(known), []byte(token)) == 1 {
			return tenant, nil
		}
	}
	return uuid.Nil, errUnauthorized
}

type tenantKey struct{}

// authenticate answers 401 unless the request carries a known bearer token,
// and 429 when its tenant called faster than lim allows.
func (t Tokens) authenticate(lim *limiters, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, err := t.tenant(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="promoflow"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
			return
		}
		if ok, wait := lim.allow(tenant.String()); !ok {
			writeTooMany(w, wait)
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	}
}

func tenantOf(r *http.Request) uuid.UUID { return r.Context().Value(tenantKey{}).(uuid.UUID) }
