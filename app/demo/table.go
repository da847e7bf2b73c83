package demo

import (
	"fmt"
	"strings"
	"time"

	"github.com/promoflow/promoflow/handlers/event"
)

// changeShown is how long the table marks a boost that changed.
const changeShown = 3 * time.Second

// Table is the live table of s at now: the cards' boosts, then the purchases.
func Table(s State, now time.Time) []string {
	lines := []string{
		fmt.Sprintf("%-44s %s", "PromotionBoost of the demo cards", now.Format(time.TimeOnly)),
		fmt.Sprintf("  %-30s %-10s %5s", "CARD", "PUBLISHED", "BOOST"),
	}
	for _, c := range s.Cards {
		name, published := "  "+c.Label+"  "+c.Title, "yes"
		if c.Project {
			name, published = "Project "+c.Label+"  "+c.Title, ""
		} else if !c.Published {
			published = "no"
		}
		change := ""
		if c.Change != 0 && now.Sub(c.ChangedAt) < changeShown {
			change = fmt.Sprintf("  %+d", c.Change)
			if c.Change > 0 {
				change = "  ▲" + change
			} else {
				change = "  ▼" + change
			}
		}
		lines = append(lines, fmt.Sprintf("  %-30s %-10s %5d%s", name, published, c.Boost, change))
	}
	lines = append(lines, "", fmt.Sprintf("  %-8s %-20s %6s  %s", "PURCHASE", "TARGET", "WEIGHT", "STATUS"))
	for _, p := range s.Purchases {
		status := string(p.Status)
		if status == "" {
			status = "-"
		}
		lines = append(lines, strings.TrimRight(fmt.Sprintf("  %-8s %-20s %6d  %-10s %s", p.Label, p.Target, p.Weight, status, when(p, now)), " "))
	}
	return lines
}

// when says what comes next for p.
func when(p PurchaseState, now time.Time) string {
	switch {
	case p.Status != event.StatusActive:
		return ""
	case p.Kind == event.TargetPost:
		return "a Post: the news context's, the catalog ignores it"
	case !p.CancelAt.IsZero():
		return "the demo cancels it in " + left(p.CancelAt, now)
	default:
		return "ends in " + left(p.EndsAt, now)
	}
}

// left is the time from now to t: 12s, 59m, 1h.
func left(t, now time.Time) string {
	d := max(t.Sub(now), 0)
	if d < time.Minute {
		return fmt.Sprintf("%ds", d.Round(time.Second)/time.Second)
	}
	return strings.TrimSuffix(strings.TrimSuffix(d.Truncate(time.Minute).String(), "0s"), "0m")
}

// EventLine is ev as a line for a person: its time, its kind (bold when
// bold), its purchase, what happened.
func EventLine(ev Event, bold bool) string {
	kind := fmt.Sprintf("%-9s", ev.Kind)
	if bold {
		kind = "\x1b[1m" + kind + "\x1b[0m"
	}
	return fmt.Sprintf("%s  %s %-3s %s", ev.At.Format(time.TimeOnly), kind, ev.Purchase, ev.Text)
}
