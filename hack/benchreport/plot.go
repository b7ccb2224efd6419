package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// latencyPoint is one federation size of one method.
type latencyPoint struct {
	clusters float64
	p50, p99 float64
}

// plotData returns the broker suite's latencies of plotMode runs by method.
func plotData(sr *SuiteResult) map[string][]latencyPoint {
	re := regexp.MustCompile(brokerPattern)
	out := map[string][]latencyPoint{}
	for _, name := range sr.names {
		m := re.FindStringSubmatch(name)
		if m == nil || m[3] != plotMode {
			continue
		}
		n, err := strconv.Atoi(m[1])
		if err != nil || n <= 0 {
			continue
		}
		p50, ok1 := sr.value(name, "p50-ms")
		p99, ok2 := sr.value(name, "p99-ms")
		if !ok1 || !ok2 || p50 <= 0 || p99 <= 0 {
			continue
		}
		out[m[2]] = append(out[m[2]], latencyPoint{float64(n), p50, p99})
	}
	for _, pts := range out {
		sort.Slice(pts, func(i, j int) bool { return pts[i].clusters < pts[j].clusters })
	}
	return out
}

// writePlot draws decision latency (p50 and p99) against the number of
// clusters, full scan vs index, both axes logarithmic, into a PNG. It writes
// nothing and returns false when the suite has no such figures.
func writePlot(sr *SuiteResult, path string) (bool, error) {
	data := plotData(sr)
	if len(data) == 0 {
		return false, nil
	}
	methods := make([]string, 0, len(data))
	for m := range data {
		methods = append(methods, m)
	}
	// The index first, its baseline second, anything else after.
	rank := func(m string) int {
		switch m {
		case brokerIndex:
			return 0
		case brokerScan:
			return 1
		}
		return 2
	}
	sort.Slice(methods, func(i, j int) bool {
		if rank(methods[i]) != rank(methods[j]) {
			return rank(methods[i]) < rank(methods[j])
		}
		return methods[i] < methods[j]
	})
	label := map[string]string{brokerIndex: "index", brokerScan: "full scan"}
	colors := map[string]color.Color{
		brokerIndex: color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		brokerScan:  color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	}
	others := []color.Color{color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}}

	p := plot.New()
	p.Title.Text = "Broker decision latency vs number of clusters (" + plotMode + ": one caller)"
	p.X.Label.Text = "clusters in the federation"
	p.Y.Label.Text = "decision latency, ms"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.YOffs = -vg.Points(4)
	grid := plotter.NewGrid()
	grid.Vertical.Color = color.Gray{Y: 0xe0}
	grid.Horizontal.Color = color.Gray{Y: 0xe0}
	p.Add(grid)

	minX, maxX := math.Inf(1), math.Inf(-1)
	minY, maxY := math.Inf(1), math.Inf(-1)
	see := func(x, y float64) {
		minX, maxX = math.Min(minX, x), math.Max(maxX, x)
		minY, maxY = math.Min(minY, y), math.Max(maxY, y)
	}
	for i, m := range methods {
		c, ok := colors[m]
		if !ok {
			c = others[i%len(others)]
		}
		name := label[m]
		if name == "" {
			name = m
		}
		for _, q := range []struct {
			what   string
			of     func(latencyPoint) float64
			dashes []vg.Length
			glyph  draw.GlyphDrawer
		}{
			{"p50", func(l latencyPoint) float64 { return l.p50 }, nil, draw.CircleGlyph{}},
			{"p99", func(l latencyPoint) float64 { return l.p99 }, []vg.Length{vg.Points(6), vg.Points(3)}, draw.TriangleGlyph{}},
		} {
			xys := make(plotter.XYs, len(data[m]))
			for k, pt := range data[m] {
				xys[k].X, xys[k].Y = pt.clusters, q.of(pt)
				see(xys[k].X, xys[k].Y)
			}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return false, err
			}
			line.Color, line.Width, line.Dashes = c, vg.Points(1.5), q.dashes
			points.Color, points.Shape, points.Radius = c, q.glyph, vg.Points(3)
			p.Add(line, points)
			p.Legend.Add(name+" "+q.what, line, points)
		}
	}

	// The floor: a trivial script's round trip on the same server and client.
	floor, haveFloor := sr.value(brokerTrivial+plotMode, "p99-ms")
	if haveFloor && floor > 0 {
		see(minX, floor)
	}
	// The target at 10,000 clusters.
	const targetX, targetY = 10000.0, 5.0
	see(targetX, targetY)

	x0, x1 := minX/1.5, maxX*1.5
	y0, y1 := minY/1.8, maxY*1.8
	if haveFloor && floor > 0 {
		ref, err := plotter.NewLine(plotter.XYs{{X: x0, Y: floor}, {X: x1, Y: floor}})
		if err != nil {
			return false, err
		}
		ref.Color, ref.Width, ref.Dashes = color.Gray{Y: 0x80}, vg.Points(1), []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(ref)
		p.Legend.Add(fmt.Sprintf("trivial EVALSHA p99 (floor), %s ms", fmtNum(floor)), ref)
	}
	target, err := plotter.NewScatter(plotter.XYs{{X: targetX, Y: targetY}})
	if err != nil {
		return false, err
	}
	target.Color, target.Shape, target.Radius = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, draw.CrossGlyph{}, vg.Points(6)
	p.Add(target)
	p.Legend.Add("target: p99 < 5 ms at 10,000 clusters", target)

	p.X.Min, p.X.Max = x0, x1
	p.Y.Min, p.Y.Max = y0, y1
	p.X.Tick.Marker = logTicks(x0, x1)
	p.Y.Tick.Marker = logTicks(y0, y1)

	const dpi = 96
	c := vgimg.NewWith(
		vgimg.UseWH(vg.Length(plotWidthPx)*vg.Inch/dpi, vg.Length(plotHeightPx)*vg.Inch/dpi),
		vgimg.UseDPI(dpi))
	p.Draw(draw.New(c))
	f, err := os.Create(path)
	if err != nil {
		return false, err
	}
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(f); err != nil {
		_ = f.Close()
		return false, err
	}
	return true, f.Close()
}

// logTicks labels the powers of ten between lo and hi (and 2 and 5 times
// them when fewer than three powers fall in the range); minor ticks at the
// other multiples.
func logTicks(lo, hi float64) plot.ConstantTicks {
	first, last := int(math.Floor(math.Log10(lo))), int(math.Ceil(math.Log10(hi)))
	decades := 0
	for e := first; e <= last; e++ {
		if v := math.Pow10(e); v >= lo && v <= hi {
			decades++
		}
	}
	var ticks plot.ConstantTicks
	for e := first; e <= last; e++ {
		for k := 1; k <= 9; k++ {
			v := float64(k) * math.Pow10(e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if k == 1 || (decades < 3 && (k == 2 || k == 5)) {
				t.Label = tickLabel(v)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

func tickLabel(v float64) string {
	if v >= 1000 {
		return fmtInt(v)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
