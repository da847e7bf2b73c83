// Command benchplot draws docs/benchmarks.md's plot from the output of
// BenchmarkConsumer: consumer events/s against the topic's partition count,
// with the raw-SQL baseline of the same run (one transaction per event).
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
// BenchmarkConsumer/partitions=6-2  1  7221919656 ns/op  1489 consumer-events/s  1.241 ratio  1200 raw-events/s
var line = regexp.MustCompile(`^BenchmarkConsumer/partitions=(\d+)\S*\s.*?([\d.]+) consumer-events/s.*?([\d.]+) raw-events/s`)

type point struct{ partitions, consumer, raw float64 }

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
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var p point
		var err error
		for i, dst := range []*float64{&p.partitions, &p.consumer, &p.raw} {
			if *dst, err = strconv.ParseFloat(m[i+1], 64); err != nil {
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
	consumer, raw := make(plotter.XYs, len(points)), make(plotter.XYs, len(points))
	for i, pt := range points {
		consumer[i] = plotter.XY{X: pt.partitions, Y: pt.consumer}
		raw[i] = plotter.XY{X: pt.partitions, Y: pt.raw}
	}
	for _, s := range []struct {
		name string
		xys  plotter.XYs
		dash []vg.Length
	}{{"consumer (Kafka → chain → PostgreSQL)", consumer, nil}, {"raw SQL, one transaction per event, as many workers", raw, []vg.Length{vg.Points(4), vg.Points(3)}}} {
		l, pts, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return err
		}
		l.Dashes = s.dash
		p.Add(l, pts)
		p.Legend.Add(s.name, l, pts)
	}
	top := 0.0
	for _, pt := range points {
		top = max(top, pt.consumer, pt.raw)
	}
	p.Y.Max = top * 1.35 // room for the legend above the lines
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}
