// Command benchplot draws docs/benchmarks.md's plot from the output of
// BenchmarkConsumer: consumer events/s against the topic's partition count,
// with the two baselines of the same run (the consumer's batches straight to
// PostgreSQL, and one transaction per event at its best concurrency).
//
//	go test -run '^$' -bench BenchmarkConsumer -benchtime 1x ./router/ | go run ./scripts/benchplot -o docs/benchmarks-consumer.png
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// line is one BenchmarkConsumer result, e.g.
// BenchmarkConsumer/partitions=6-2  1  7221919656 ns/op  1200 batched-events/s  1100 consumer-events/s  900 per-event-events/s ...
var line = regexp.MustCompile(`^BenchmarkConsumer/partitions=(\d+)\S*\s`)

// metric finds one reported metric of a line by its unit.
func metric(text, unit string) (float64, error) {
	m := regexp.MustCompile(`([\d.]+) ` + regexp.QuoteMeta(unit) + `(\s|$)`).FindStringSubmatch(text)
	if m == nil {
		return 0, fmt.Errorf("no %s in %q", unit, text)
	}
	return strconv.ParseFloat(m[1], 64)
}

type point struct{ partitions, consumer, batched, perEvent float64 }

func main() {
	out := flag.String("o", "docs/benchmarks-consumer.png", "PNG to write")
	flag.Parse()
	points, err := read(os.Stdin)
	if err == nil && len(points) == 0 {
		err = fmt.Errorf("no BenchmarkConsumer lines on stdin")
	}
	if err == nil {
		err = draw(points, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func read(r io.Reader) ([]point, error) {
	var out []point
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		text := sc.Text()
		m := line.FindStringSubmatch(text)
		if m == nil {
			continue
		}
		var p point
		var err error
		if p.partitions, err = strconv.ParseFloat(m[1], 64); err != nil {
			return nil, err
		}
		for unit, dst := range map[string]*float64{"consumer-events/s": &p.consumer, "batched-events/s": &p.batched,
			"per-event-events/s": &p.perEvent} {
			if *dst, err = metric(text, unit); err != nil {
				return nil, err
			}
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].partitions < out[j].partitions })
	return out, sc.Err()
}

func draw(points []point, path string) error {
	p := plot.New()
	p.Title.Text = "Catalog consumer, cascade workload (1 process, 2 cores)"
	p.X.Label.Text = "partitions of the purchase topic"
	p.Y.Label.Text = "events/s"
	p.Y.Min = 0
	consumer, batched, perEvent := make(plotter.XYs, len(points)), make(plotter.XYs, len(points)), make(plotter.XYs, len(points))
	top := 0.0
	for i, pt := range points {
		consumer[i] = plotter.XY{X: pt.partitions, Y: pt.consumer}
		batched[i] = plotter.XY{X: pt.partitions, Y: pt.batched}
		perEvent[i] = plotter.XY{X: pt.partitions, Y: pt.perEvent}
		top = max(top, pt.consumer, pt.batched, pt.perEvent)
	}
	for _, s := range []struct {
		name string
		xys  plotter.XYs
		dash []vg.Length
	}{
		{"consumer (Kafka → chain → group commit → PostgreSQL)", consumer, nil},
		{"raw SQL, the consumer's batches, same workers", batched, []vg.Length{vg.Points(4), vg.Points(3)}},
		{"raw SQL, one transaction per event, best concurrency", perEvent, []vg.Length{vg.Points(1), vg.Points(3)}},
	} {
		l, pts, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return err
		}
		l.Dashes = s.dash
		p.Add(l, pts)
		p.Legend.Add(s.name, l, pts)
	}
	p.Y.Max = top * 1.45 // room for the legend above the lines
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}
