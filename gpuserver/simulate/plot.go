package simulate

import (
	"image"
	"image/color"
	"image/png"
	"io"
	"strconv"
)

// Series is one line of a plot: y values in [0, 1] at the given x values.
type Series struct {
	Name  string
	Color color.RGBA
	X     []float64
	Y     []float64
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

// Panel is one plot panel: a title and its lines.
type Panel struct {
	Title  string
	Series []Series
}

// PlotPanels draws side-by-side panels, each with y from 0 to 1 (gridlines every 0.1, labelled every 0.2) and x
// from 0 to xMax (gridlines and labels every xStep), titled, with the axis labels and a legend of the first
// panel's series names under them, and writes a PNG. It uses only the standard library (a built-in 3x5 font).
func PlotPanels(w io.Writer, panels []Panel, xMax, xStep float64, xLabel, yLabel string) error {
	const pw, ph, left, right, top, gap = 520, 360, 50, 20, 50, 70
	black := color.RGBA{0, 0, 0, 255}
	var legend []Series
	if len(panels) > 0 {
		legend = panels[0].Series
	}
	const perRow, colW, rowH = 4, 280, 22
	rows := (len(legend) + perRow - 1) / perRow
	width := len(panels)*(left+pw+right) + right
	height := top + ph + gap + rows*rowH + 10
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	for pi, panel := range panels {
		x0, y0 := left+pi*(left+pw+right), top
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
					line(img, qx, qy, px, py, s.Color, 2)
				}
			}
		}
	}
	for i, s := range legend {
		x, y := left+(i%perRow)*colW, top+ph+gap+(i/perRow)*rowH
		fill(img, image.Rect(x, y+2, x+24, y+8), s.Color)
		drawText(img, x+30, y, s.Name, black)
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
