package replay

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// PlotFormat returns the picture format for a --plot file name: png or svg.
func PlotFormat(name string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(name)); ext {
	case ".png", ".svg":
		return ext[1:], nil
	default:
		return "", fmt.Errorf("plot %q: the file name must end in .png or .svg", name)
	}
}

// Plot colours: admitted in blue, limited in red (colour-blind safe pair of the Okabe-Ito
// palette).
var (
	admittedColor = color.RGBA{R: 0x00, G: 0x72, B: 0xb2, A: 0xff}
	limitedColor  = color.RGBA{R: 0xd5, G: 0x5e, B: 0x00, A: 0xff}
)

// Plot draws the report's series, one panel per policy stacked in file order, requests per
// second over the simulated time, admitted against limited (shadow-limited for shadow
// policies), as a PNG or SVG (format "png" or "svg") to w.
func (rep *Report) Plot(w io.Writer, format string) error {
	s := rep.Series
	if len(s.Policies) == 0 {
		return errors.New("plot: no policies")
	}
	if rep.Requests == 0 {
		return errors.New("plot: no requests to draw")
	}
	span := rep.To.Sub(rep.From)
	tickFormat := "15:04:05"
	switch {
	case span > 48*time.Hour:
		tickFormat = "Jan 2"
	case span > 12*time.Hour:
		tickFormat = "Jan 2 15:04"
	case span > 10*time.Minute:
		tickFormat = "15:04"
	}
	plots := make([][]*plot.Plot, len(s.Policies))
	for i, ps := range s.Policies {
		p := plot.New()
		pr := rep.Policies[i]
		p.Title.Text = fmt.Sprintf("%s (key %s, %s): %d matched, %d admitted, %d limited",
			pr.Name, pr.Key, pr.Mode, pr.Matched, pr.Admitted, pr.Limited+pr.ShadowLimited)
		p.Title.TextStyle.Font.Size = vg.Points(11)
		p.Y.Label.Text = "requests/s"
		p.Y.Min = 0
		p.X.Tick.Marker = plot.TimeTicks{Format: tickFormat}
		if i == len(s.Policies)-1 {
			p.X.Label.Text = "simulated time (UTC, from the log)"
		}
		p.Add(plotter.NewGrid())
		limitedName := "limited"
		if pr.Mode == "shadow" {
			limitedName = "would be limited (shadow)"
		}
		peak := 0.0
		for _, l := range []struct {
			name   string
			counts []int64
			c      color.Color
		}{{"admitted", ps.Admitted, admittedColor}, {limitedName, ps.Limited, limitedColor}} {
			pts := rate(s, l.counts)
			for _, pt := range pts {
				peak = max(peak, pt.Y)
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return fmt.Errorf("plot %s: %w", ps.Name, err)
			}
			line.Color = l.c
			line.Width = vg.Points(1.2)
			p.Add(line)
			p.Legend.Add(l.name, line)
		}
		p.Legend.Top = true
		p.Legend.Left = true
		p.Legend.XOffs = vg.Points(8)
		p.Legend.TextStyle.Font.Size = vg.Points(10)
		p.Y.Max = max(1, peak*1.3) // room for the legend above the lines
		p.Y.Tick.Marker = plainTicks{}
		plots[i] = []*plot.Plot{p}
	}

	width := 10 * vg.Inch
	height := vg.Length(len(plots)) * 2.6 * vg.Inch
	var c vg.CanvasWriterTo
	switch format {
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110),
			vgimg.UseBackgroundColor(color.White))}
	case "svg":
		c = vgsvg.New(width, height)
	default:
		return fmt.Errorf("plot: format %q: want png or svg", format)
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("plot: write: %w", err)
	}
	return nil
}

// maxPoints is the most points a line of the picture has: a 20-minute log has 1,200 one-second
// buckets, more than a panel has pixels to show, and a window algorithm's on-off rhythm at one
// second would paint a solid block. Neighbouring buckets are summed down to at most this many.
const maxPoints = 300

// rate turns bucket counts into points (bucket middle in unix seconds, requests per second).
func rate(s Series, counts []int64) plotter.XYs {
	group := (len(counts) + maxPoints - 1) / maxPoints
	group = max(group, 1)
	step := s.StepSeconds * float64(group)
	pts := make(plotter.XYs, 0, (len(counts)+group-1)/group)
	start := float64(s.Start.UnixNano()) / 1e9
	for i := 0; i < len(counts); i += group {
		var n int64
		for _, c := range counts[i:min(i+group, len(counts))] {
			n += c
		}
		pts = append(pts, plotter.XY{X: start + (float64(i/group)+0.5)*step, Y: float64(n) / step})
	}
	return pts
}

// plainTicks are gonum's default ticks labelled without trailing zeros (250, not 250.00).
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = tickLabel(ticks[i].Value)
		}
	}
	return ticks
}

// tickLabel prints a tick's value without float noise: gonum steps ticks by repeated addition,
// so 1.2 arrives as 1.2000000000000002 and 60 as 60.00000000000007. Twelve significant digits
// are far more than any axis shows, and drop the noise.
func tickLabel(v float64) string {
	r, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 12, 64), 64)
	if err != nil {
		r = v
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}
