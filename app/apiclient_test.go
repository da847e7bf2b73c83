package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// purchaseAnswer is what POST /promotions answered.
type purchaseAnswer struct {
	Status     int
	RetryAfter string
	ID         uuid.UUID
	Body       string
}

// postPurchase asks the purchase API at addr for a purchase on project that
// ends after lasts, and returns the answer; err is a transport error.
func postPurchase(addr, token string, project uuid.UUID, weight int, lasts time.Duration) (purchaseAnswer, error) {
	body, _ := json.Marshal(map[string]any{"PackageKind": "Top", "BoostWeight": weight,
		"Targets": []map[string]string{{"TargetKind": "Project", "TargetId": project.String()}},
		"EndsAt":  time.Now().Add(lasts).UTC().Format(time.RFC3339Nano)})
	req, err := http.NewRequest("POST", "http://"+addr+"/promotions", bytes.NewReader(body))
	if err != nil {
		return purchaseAnswer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return purchaseAnswer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return purchaseAnswer{}, err
	}
	a := purchaseAnswer{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Body: string(raw)}
	if resp.StatusCode == http.StatusCreated {
		var created struct{ Id uuid.UUID }
		if err := json.Unmarshal(raw, &created); err != nil {
			return a, err
		}
		a.ID = created.Id
	}
	return a, nil
}

// createPurchase makes a purchase that ends after lasts and wants a 201.
func createPurchase(t *testing.T, addr, token string, lasts time.Duration) uuid.UUID {
	t.Helper()
	a, err := postPurchase(addr, token, uuid.New(), 5, lasts)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, a.Status, a.Body)
	return a.ID
}

// adminCall sends body to the catalog's feed or admin path (on the internal
// listener) with the admin token, which serves both when set alone,
// wants one of the statuses, and returns the answer's body.
func adminCall(t *testing.T, method, addr, path, body string, want ...int) string {
	t.Helper()
	if strings.HasPrefix(path, "/admin/") {
		addr = internalOf(addr) // the rebuild is on the internal listener
	}
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+pooledAdmin)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, want, resp.StatusCode, "%s %s: %s", method, path, raw)
	return string(raw)
}

// waitBoost waits until the card at path (GET on the catalog at addr, with
// the admin token, which sees private cards too) has boost.
func waitBoost(t *testing.T, addr, path string, boost int) {
	t.Helper()
	last := -1
	ok := assert.Eventually(t, func() bool {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+pooledAdmin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var card struct{ PromotionBoost int }
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&card) != nil {
			return false
		}
		last = card.PromotionBoost
		return last == boost
	}, 60*time.Second, 50*time.Millisecond)
	if !ok {
		t.Fatalf("%s: boost %d, want %d", path, last, boost)
	}
}
