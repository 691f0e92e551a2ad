package simulate

import (
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a plot: y values in [0, 1] at the given x values.
type Series struct {
	Name  string
	Color color.RGBA
	X     []float64
	Y     []float64
	// Dashed draws the line dashed (an upper bound beside the measured lines).
	Dashed bool
}

// Palette gives distinct line colours, one per policy in controller.Policies order.
var Palette = []color.RGBA{
	{220, 20, 60, 255},   // crimson
	{30, 90, 200, 255},   // blue
	{34, 139, 34, 255},   // green
	{255, 140, 0, 255},   // orange
	{148, 0, 211, 255},   // violet
	{0, 160, 160, 255},   // teal
	{120, 120, 120, 255}, // grey
	{139, 69, 19, 255},   // brown
}

// Panel is one plot panel: a title and its lines. XMax and XStep, when set, replace PlotPanels' own.
type Panel struct {
	Title       string
	Series      []Series
	XMax, XStep float64
	XLabel      string // replaces PlotPanels' xLabel when set
}

// PlotPanels draws side-by-side panels, each with y from 0 to 1 (gridlines every 0.1, labelled every 0.2) and x
// from 0 to xMax (gridlines and labels every xStep), titled, with the axis labels and a legend of the first
// panel's series names under them, and writes a PNG. It uses only the standard library (a built-in 3x5 font).
func PlotPanels(w io.Writer, panels []Panel, xMax, xStep float64, xLabel, yLabel string) error {
	const pw, ph, left, right, top, gap = 520, 360, 50, 20, 50, 70
	black := color.RGBA{0, 0, 0, 255}
	var legend []Series
	seen := map[string]bool{}
	for _, p := range panels { // every series name once, in the order of first appearance
		for _, s := range p.Series {
			if !seen[s.Name] {
				seen[s.Name] = true
				legend = append(legend, s)
			}
		}
	}
	const perRow, colW, rowH = 4, 280, 22
	rows := (len(legend) + perRow - 1) / perRow
	width := len(panels)*(left+pw+right) + right
	height := top + ph + gap + rows*rowH + 10
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	for pi, panel := range panels {
		x0, y0 := left+pi*(left+pw+right), top
		xMax, xStep, xLabel := xMax, xStep, xLabel
		if panel.XMax > 0 && panel.XStep > 0 {
			xMax, xStep = panel.XMax, panel.XStep
		}
		if panel.XLabel != "" {
			xLabel = panel.XLabel
		}
		drawText(img, x0+(pw-textWidth(panel.Title))/2, 8, panel.Title, black)
		drawText(img, x0-left+6, 30, yLabel, black)
		grid := color.RGBA{225, 225, 225, 255}
		for i := 0; i <= 10; i++ {
			y := y0 + ph - i*ph/10
			line(img, x0, y, x0+pw, y, grid, 1)
			if i%2 == 0 {
				l := strconv.FormatFloat(float64(i)/10, 'f', 1, 64)
				drawText(img, x0-textWidth(l)-6, y-5, l, black)
			}
		}
		for x := 0.0; x <= xMax; x += xStep {
			px := x0 + int(x/xMax*pw)
			line(img, px, y0, px, y0+ph, grid, 1)
			l := strconv.FormatFloat(x, 'f', -1, 64)
			drawText(img, px-textWidth(l)/2, y0+ph+6, l, black)
		}
		drawText(img, x0+(pw-textWidth(xLabel))/2, y0+ph+26, xLabel, black)
		line(img, x0, y0+ph, x0+pw, y0+ph, black, 1)
		line(img, x0, y0, x0, y0+ph, black, 1)
		for _, s := range panel.Series {
			for i := range s.X {
				px := x0 + int(s.X[i]/xMax*pw)
				py := y0 + ph - int(s.Y[i]*ph)
				fill(img, image.Rect(px-3, py-3, px+4, py+4), s.Color)
				if i > 0 {
					qx := x0 + int(s.X[i-1]/xMax*pw)
					qy := y0 + ph - int(s.Y[i-1]*ph)
					if s.Dashed {
						dashed(img, qx, qy, px, py, s.Color)
					} else {
						line(img, qx, qy, px, py, s.Color, 2)
					}
				}
			}
		}
	}
	for i, s := range legend {
		x, y := left+(i%perRow)*colW, top+ph+gap+(i/perRow)*rowH
		if s.Dashed {
			dashed(img, x, y+5, x+24, y+5, s.Color)
		} else {
			fill(img, image.Rect(x, y+2, x+24, y+8), s.Color)
		}
		drawText(img, x+30, y, s.Name, black)
	}
	return png.Encode(w, img)
}

// dashed draws a 2-pixel line in 6-pixel dashes.
func dashed(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	n := max(abs(x1-x0), abs(y1-y0))
	for i := 0; i <= n; i++ {
		if (i/6)%2 == 1 {
			continue
		}
		x := x0 + (x1-x0)*i/max(1, n)
		y := y0 + (y1-y0)*i/max(1, n)
		fill(img, image.Rect(x-1, y-1, x+1, y+1), c)
	}
}

// Bar is one bar of PlotBars.
type Bar struct {
	Label string
	Value float64
	Color color.RGBA
}

// PlotBars draws a bar chart on a logarithmic y axis (gridlines and labels at 1, 10, 100, ...; values must be
// >= 1 to show), each bar labelled under it and its value written above it, titled, and writes a PNG. It uses
// only the standard library.
func PlotBars(w io.Writer, title, yLabel string, bars []Bar) error {
	const ph, left, top, bottom, barW, gap = 360, 70, 60, 90, 170, 30
	black := color.RGBA{0, 0, 0, 255}
	top10 := 1.0
	for _, b := range bars {
		for top10 < b.Value {
			top10 *= 10
		}
	}
	decades := math.Log10(top10)
	if decades == 0 {
		decades = 1
	}
	width := left + len(bars)*(barW+gap) + gap
	width = max(width, textWidth(title)+2*left)
	img := image.NewRGBA(image.Rect(0, 0, width, top+ph+bottom))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	drawText(img, (width-textWidth(title))/2, 10, title, black)
	drawText(img, 6, 34, yLabel, black)
	yOf := func(v float64) int { return top + ph - int(math.Log10(max(1, v))/decades*ph) }
	grid := color.RGBA{225, 225, 225, 255}
	for d := 1.0; d <= top10; d *= 10 {
		y := yOf(d)
		line(img, left, y, width-gap/2, y, grid, 1)
		l := strconv.FormatFloat(d, 'f', -1, 64)
		drawText(img, left-textWidth(l)-6, y-5, l, black)
	}
	line(img, left, top, left, top+ph, black, 1)
	line(img, left, top+ph, width-gap/2, top+ph, black, 1)
	for i, b := range bars {
		x := left + gap + i*(barW+gap)
		y := yOf(b.Value)
		fill(img, image.Rect(x, y, x+barW, top+ph), b.Color)
		v := strconv.FormatFloat(b.Value, 'f', 1, 64)
		drawText(img, x+(barW-textWidth(v))/2, y-14, v, black)
		for li, part := range strings.Split(b.Label, "\n") {
			drawText(img, x+(barW-textWidth(part))/2, top+ph+8+li*14, part, black)
		}
	}
	return png.Encode(w, img)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, width int) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	err := dx + dy
	for {
		fill(img, image.Rect(x0-width/2, y0-width/2, x0-width/2+width, y0-width/2+width), c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(a int) int {
	if a < 0 {
		return -a
	}
	return a
}
