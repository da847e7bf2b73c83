package main

import (
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDashboard_EveryPanelLinksToTheTraceSearchByCorrelationID: the Grafana
// dashboard has a correlation_id variable, and each panel links to
// Explore's Jaeger search of the traces whose spans carry it, in the
// service the panel shows.
func TestDashboard_EveryPanelLinksToTheTraceSearchByCorrelationID(t *testing.T) {
	raw, err := os.ReadFile("../deploy/grafana/dashboards/promoflow.json")
	require.NoError(t, err)
	var d struct {
		Templating struct{ List []struct{ Name, Type string } }
		Panels     []struct {
			Title string
			Links []struct{ Title, URL string }
		}
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	require.Contains(t, d.Templating.List, struct{ Name, Type string }{"correlation_id", "textbox"})
	require.NotEmpty(t, d.Panels)
	for _, p := range d.Panels {
		require.Len(t, p.Links, 1, p.Title)
		u, err := url.Parse(p.Links[0].URL)
		require.NoError(t, err, p.Title)
		require.Equal(t, "/explore", u.Path, p.Title)
		var panes map[string]struct {
			Datasource string
			Queries    []struct{ QueryType, Service, Tags string }
		}
		require.NoError(t, json.Unmarshal([]byte(u.Query().Get("panes")), &panes), p.Title)
		q := panes["traces"].Queries[0]
		require.Equal(t, "jaeger", panes["traces"].Datasource, p.Title)
		require.Equal(t, "search", q.QueryType, p.Title)
		require.Equal(t, "correlation_id=${correlation_id:percentencode}", q.Tags, p.Title)
		require.True(t, strings.HasPrefix(q.Service, "promoflow-"), p.Title)
	}
}
