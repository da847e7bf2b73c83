package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
)

// client calls the two HTTP APIs as any other client of them would: the
// catalog's card feed and reads, and the purchase API.
type client struct {
	http                     *http.Client
	promotionURL, catalogURL string
	catalogInternalURL       string
	apiToken, feedToken      string
}

// do sends body (JSON, or none) and decodes a 2xx answer into out (when not
// nil); another status is an error that quotes the answer's problem detail.
func (c client) do(ctx context.Context, method, url, token string, body, out any) error {
	var r io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var problem struct{ Detail string }
		_ = json.Unmarshal(raw, &problem)
		return fmt.Errorf("%s %s: %s %s", method, strings.TrimPrefix(url, "http://"), resp.Status, problem.Detail)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// putCard sends c to the card feed.
func (c client) putCard(ctx context.Context, cd card) error {
	if cd.IsProject() {
		return c.do(ctx, http.MethodPut, c.catalogURL+"/cards/projects/"+cd.ID.String(), c.feedToken,
			map[string]any{"Title": cd.Title, "Status": "Selling", "Visibility": "Public"}, nil)
	}
	return c.do(ctx, http.MethodPut, c.catalogURL+"/cards/property-objects/"+cd.ID.String(), c.feedToken,
		map[string]any{"ProjectId": cd.Project, "Published": cd.Published, "Status": "Available", "Price": "125000"}, nil)
}

// cardBoost is what the demo reads of a card.
type cardBoost struct {
	Id             uuid.UUID
	PromotionBoost int
}

// readBoosts reads every demo card's PromotionBoost through the catalog's
// reads with the feed's token, which sees unpublished objects too: each
// project card and its project's objects.
func (c client) readBoosts(ctx context.Context, cards []card) (map[uuid.UUID]int, error) {
	out := map[uuid.UUID]int{}
	for _, cd := range cards {
		if !cd.IsProject() {
			continue
		}
		var project cardBoost
		if err := c.do(ctx, http.MethodGet, c.catalogURL+"/cards/projects/"+cd.ID.String(), c.feedToken, nil, &project); err != nil {
			return nil, err
		}
		out[cd.ID] = project.PromotionBoost
		var objects struct{ Items []cardBoost }
		if err := c.do(ctx, http.MethodGet, c.catalogURL+"/cards/projects/"+cd.ID.String()+"/property-objects", c.feedToken, nil, &objects); err != nil {
			return nil, err
		}
		for _, o := range objects.Items {
			out[o.Id] = o.PromotionBoost
		}
	}
	return out, nil
}

// purchaseAnswer is what the purchase API answers of a purchase.
type purchaseAnswer struct {
	Id        uuid.UUID
	Status    event.Status
	EndsAt    time.Time
	UpdatedAt time.Time
}

func (p *purchase) take(a purchaseAnswer) {
	p.ID, p.Status, p.EndsAt, p.UpdatedAt = a.Id, a.Status, a.EndsAt, a.UpdatedAt
}

// buy creates p on target through the purchase API.
func (c client) buy(ctx context.Context, p *purchase, target uuid.UUID) error {
	now := time.Now()
	var a purchaseAnswer
	err := c.do(ctx, http.MethodPost, c.promotionURL+"/promotions", c.apiToken, map[string]any{
		"PackageKind": "Top", "BoostWeight": p.Weight, "EndsAt": now.Add(p.Lasts).UTC().Format(time.RFC3339Nano),
		"Targets": []event.Target{{TargetKind: p.Kind, TargetId: target}},
	}, &a)
	if err != nil {
		return err
	}
	p.take(a)
	p.CreatedAt = now
	return nil
}

// cancel cancels p through the purchase API.
func (c client) cancel(ctx context.Context, p *purchase) error {
	var a purchaseAnswer
	if err := c.do(ctx, http.MethodPost, c.promotionURL+"/promotions/"+p.ID.String()+"/cancel", c.apiToken, nil, &a); err != nil {
		return err
	}
	p.take(a)
	return nil
}

// refresh reads p's status through the purchase API.
func (c client) refresh(ctx context.Context, p *purchase) error {
	var a purchaseAnswer
	if err := c.do(ctx, http.MethodGet, c.promotionURL+"/promotions/"+p.ID.String(), c.apiToken, nil, &a); err != nil {
		return err
	}
	p.take(a)
	return nil
}

// postOnlyMetric is the catalog's count of the events it ignored because
// they promote Posts only (router/metrics_catalog.go).
const postOnlyMetric = `catalog_promotion_consumed_total{outcome="post_only"}`

// postOnlyIgnored reads postOnlyMetric from the catalog's /metrics: no card
// shows that the catalog saw a Post-only purchase, its metric does.
func (c client) postOnlyIgnored(ctx context.Context) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.catalogInternalURL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), postOnlyMetric+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, lines.Err() // not there yet: the catalog has counted none
}
