package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
)

// MinTokenLength is the fewest characters a bearer token may have outside
// dev: 16 random characters are out of reach of guessing through the API's
// rate limits.
const MinTokenLength = 16

// ErrShortToken is a token shorter than MinTokenLength.
var ErrShortToken = fmt.Errorf("a token has fewer than %d characters; make one with: openssl rand -hex 16", MinTokenLength)

// digest is a token's SHA-256. Tokens are kept and compared as digests: the
// comparison is constant-time over equal lengths whatever the token's
// length, and a heap dump holds no usable token.
type digest [sha256.Size]byte

func digestOf(token string) digest { return sha256.Sum256([]byte(token)) }

// matches reports whether token's digest is d, in constant time. The zero
// digest (no token configured) matches nothing.
func (d digest) matches(token string) bool {
	if d == (digest{}) {
		return false
	}
	got := digestOf(token)
	return subtle.ConstantTimeCompare(d[:], got[:]) == 1
}

// bearer is the request's bearer token, "" when it has none.
func bearer(r *http.Request) string {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return token
}

// Tokens maps the digests of bearer tokens to the tenant whose manager holds them.
type Tokens map[digest]uuid.UUID

// NewTokens is the Tokens of raw token → tenant pairs.
func NewTokens(raw map[string]uuid.UUID) Tokens {
	out := make(Tokens, len(raw))
	for token, tenant := range raw {
		out[digestOf(token)] = tenant
	}
	return out
}

// ParseTokens reads "token=tenant-uuid,token2=tenant-uuid". With minLength
// above 0 a shorter token is ErrShortToken. Errors name a pair by its
// position, never by any part of its token.
func ParseTokens(s string, minLength int) (Tokens, error) {
	raw := map[string]uuid.UUID{}
	var errs []error
	for i, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		token, tenant, ok := strings.Cut(pair, "=")
		token = strings.TrimSpace(token)
		if !ok || token == "" {
			errs = append(errs, fmt.Errorf("token %d: want token=tenant-uuid", i+1))
			continue
		}
		id, err := uuid.Parse(strings.TrimSpace(tenant))
		if err != nil || id == uuid.Nil {
			errs = append(errs, fmt.Errorf("token %d: tenant %q is not a UUID", i+1, tenant))
			continue
		}
		if len(token) < minLength {
			errs = append(errs, fmt.Errorf("token %d: %w", i+1, ErrShortToken))
			continue
		}
		raw[token] = id
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return NewTokens(raw), nil
}

// Has reports whether token is one of t.
func (t Tokens) Has(token string) bool {
	_, ok := t[digestOf(token)]
	return ok
}

var errUnauthorized = errors.New("unauthorized")

// tenant resolves the caller's tenant from its bearer token.
func (t Tokens) tenant(r *http.Request) (uuid.UUID, error) {
	token := bearer(r)
	if token == "" {
		return uuid.Nil, errUnauthorized
	}
	// One lookup by digest: which tokens exist does not show in the time
	// the comparison takes.
	got := digestOf(token)
	for known, tenant := range t {
		if subtle.ConstantTimeCompare(known[:], got[:]) == 1 {
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
		lim.metered(tenant.String(), w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)), next)
	}
}

func tenantOf(r *http.Request) uuid.UUID { return r.Context().Value(tenantKey{}).(uuid.UUID) }
