package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router/status"
)

// printStatus writes the report as one screen: a line per part with its
// verdict, what it shows indented below, and each problem marked "!".
func printStatus(w io.Writer, rep status.Report, l status.Limits) error {
	p := &screen{}
	verdict := "HEALTHY"
	if err := exitOf(rep); err != nil {
		verdict = fmt.Sprintf("RED (%s; exit %d)", strings.TrimPrefix(err.Error(), "red: "), err.(statusExit).code)
	}
	p.line("promoflow status at %s: %s", rep.At.Format(time.RFC3339), verdict)
	p.line("  read by %s", buildInfo())
	p.expirer(rep.Expirer)
	p.outbox(rep.Outbox, l)
	p.consumer(rep.Consumer, l)
	p.projection(rep.Projection)
	_, err := io.WriteString(w, p.String())
	return err
}

// screen builds the text of a report.
type screen struct{ strings.Builder }

func (p *screen) line(format string, args ...any) { fmt.Fprintf(p, format+"\n", args...) }

// part opens a part with its verdict, and closes it with its problems,
// notes and error after body wrote what it shows.
func (p *screen) part(name string, h status.Health, body func()) {
	verdict := "ok"
	if h.Red() {
		verdict = "RED"
	}
	p.line("\n%-10s %s", name, verdict)
	if h.Error != "" {
		p.line("  ! cannot be read: %s", h.Error)
		return
	}
	body()
	for _, pr := range h.Problems {
		if pr.Alert != "" {
			p.line("  ! %s: %s", pr.Alert, pr.Detail)
		} else {
			p.line("  ! %s", pr.Detail)
		}
	}
	for _, n := range h.Notes {
		p.line("  - %s", n)
	}
}

func (p *screen) expirer(s status.Expirer) {
	p.part("expirer", s.Health, func() {
		if c := s.LastCycle; c != nil {
			p.line("  last cycle   %s ago: runId %s, AsOf %s, ExpiredCount %d, backlog %d, DurationMs %d (interval %s)",
				ago(c.AgeSeconds), c.RunID, c.AsOf.UTC().Format(time.RFC3339), c.ExpiredCount, c.Backlog, c.DurationMs, c.Interval)
		} else {
			p.line("  last cycle   none recorded")
		}
		if s.Due.Count == 0 {
			p.line("  due now      0 purchases")
			return
		}
		p.line("  due now      %d purchases; oldest %s, EndsAt %s (%s ago)", s.Due.Count, s.Due.Oldest,
			s.Due.OldestEndsAt.UTC().Format(time.RFC3339), ago(s.Due.OldestAgeSeconds))
	})
}

func (p *screen) outbox(s status.Outbox, l status.Limits) {
	p.part("outbox", s.Health, func() {
		p.line("  backlog      %d events (limit %d), oldest %s (limit %s)", s.Backlog, l.OutboxBacklog, ago(s.OldestAgeSeconds), l.OutboxLag)
		holds := false
		for _, r := range s.Relay {
			role := "relay"
			switch {
			case r.Holder:
				role, holds = "HOLDS the position", true
			case r.Waiting:
				role = "waits for the position"
			}
			p.line("  relay        pid %d, application %q, client %s, %s %s: %s", r.PID, r.Application, r.Client, r.State, ago(r.SinceSeconds), role)
		}
		if !holds {
			p.line("  position     held by no transaction now (an idle relay holds it for the milliseconds of each poll)")
		}
		if w := s.HeldBackBy; w != nil {
			p.line("  held back by pid %d, application %q, %s, transaction %s old (limit %s)", w.PID, w.Application, w.State, ago(w.AgeSeconds), l.HeldBack)
		} else {
			p.line("  held back by no outbox writer")
		}
		if t := s.Topic; t.Missing {
			p.line("  topic        %s MISSING (pinned %d partitions)", t.Name, t.PinnedPartitions)
		} else if t.Name != "" {
			p.line("  topic        %s: %d partitions (pinned %d), cleanup.policy=%s", t.Name, t.Partitions, t.PinnedPartitions, t.CleanupPolicy)
		}
		p.cluster(s.Cluster)
	})
}

// cluster is the outbox's cluster line: the one it runs on, and its last
// re-base, if any.
func (p *screen) cluster(c outbox.Cluster) {
	switch {
	case c.SystemIdentifier != c.Here:
		p.line("  cluster      %d, recorded %d: the first outbox writer or relay read re-bases onto it", c.Here, c.SystemIdentifier)
	case c.RebasedAt != nil && c.PreviousSystemIdentifier != nil:
		p.line("  cluster      %d, xid shift %d, re-based %s ago from %d", c.Here, c.XidShift,
			ago(c.ReadAt.Sub(*c.RebasedAt).Seconds()), *c.PreviousSystemIdentifier)
	default:
		p.line("  cluster      %d, xid shift %d, never re-based", c.Here, c.XidShift)
	}
}

func (p *screen) consumer(s status.Consumer, l status.Limits) {
	p.part("consumer", s.Health, func() {
		p.line("  group        %s: %s, %d members", s.Group, s.State, len(s.Members))
		for _, m := range s.Members {
			p.line("    %s %s: partitions %v", m.ClientID, m.Host, m.Partitions)
		}
		p.line("  lag          %d records (max %d on one partition) on %d of %d partitions; oldest %s (limit %s)",
			s.SumLag, s.MaxLag, len(s.Behind), s.Partitions, ago(s.MaxLagSeconds), l.Lag)
		for _, b := range s.Behind {
			p.line("    partition %d: committed %d, end %d, lag %d, oldest %s", b.Partition, b.Committed, b.End, b.Lag, ago(b.OldestSeconds))
		}
		for _, st := range s.Stuck {
			p.line("  stuck        partition %d at offset %d for %s (%d attempts; limit %s): %s", st.Partition, st.Offset,
				time.Since(st.Since).Round(time.Second), st.Attempts, l.Stuck, strings.ReplaceAll(st.Error, "\n", "; "))
		}
		if d := s.DeadLetters; d != nil {
			p.line("  DLQ          %d records in %s (window %s)", d.Records, d.Topic, l.DeadLetterWindow)
			for _, r := range d.Rows {
				p.line("    %d × %s (parked %d, newest %s): %s", r.Count, r.Code, r.Parked, r.Newest.UTC().Format(time.RFC3339),
					strings.ReplaceAll(r.Reason, "\n", "; "))
			}
		}
	})
}

func (p *screen) projection(s status.Projection) {
	p.part("projection", s.Health, func() {
		if c := s.CardCheck; c != nil {
			p.line("  card check   %s ago (%s): %d cards, %d drifted", ago(c.AgeSeconds), c.Source, c.Checked, c.Drifted)
			for _, d := range c.Samples {
				p.line("    %s %s: boost %d, replica says %d", d.Kind, d.ID, d.Stored, d.Want)
			}
		} else {
			p.line("  card check   none recorded")
		}
		rb := s.Rebuild
		if rb.ID == "" {
			p.line("  rebuild      none")
			return
		}
		p.line("  rebuild      %s %s (phase %s), purchases %d, cards changed %d", rb.ID, rb.State, rb.Phase, rb.Purchases, rb.CardsChanged)
	})
}

// ago is a report's seconds as a duration to read.
func ago(secs float64) time.Duration {
	return time.Duration(secs * float64(time.Second)).Round(100 * time.Millisecond)
}
