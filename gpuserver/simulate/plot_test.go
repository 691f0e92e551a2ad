package simulate

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestPlotPanelsLabelsAndLegend draws two panels and checks the image: every series colour appears (lines and
// legend), and the text is black pixels outside the plot areas (titles, tick labels, legend names).
func TestPlotPanelsLabelsAndLegend(t *testing.T) {
	mk := func(i int, ys ...float64) Series {
		return Series{Name: []string{"faas-gpu", "torpor"}[i], Color: Palette[i], X: []float64{40, 160, 560}, Y: ys}
	}
	panels := []Panel{
		{Title: "left 0.5", Series: []Series{mk(0, 1, 1, 0.95), mk(1, 1, 0.9, 0.8)}},
		{Title: "right", Series: []Series{mk(0, 1, 1, 1), mk(1, 1, 1, 0.5)}},
	}
	var buf bytes.Buffer
	if err := PlotPanels(&buf, panels, 600, 80, "functions", "share"); err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv("FAAS_GPU_PLOT_DIR"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "plot.png"), buf.Bytes(), 0o644)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[[3]uint32]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			counts[[3]uint32{r >> 8, g >> 8, bl >> 8}]++
		}
	}
	for _, c := range Palette[:2] {
		if counts[[3]uint32{uint32(c.R), uint32(c.G), uint32(c.B)}] < 100 {
			t.Errorf("colour %v barely drawn", c)
		}
	}
	// Text: the top band (titles) holds black pixels; an unlabelled plot would have none there.
	black := 0
	for y := 0; y < 30; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r == 0 && g == 0 && bl == 0 {
				black++
			}
		}
	}
	if black < 50 {
		t.Errorf("titles: %d black pixels in the top band", black)
	}
}

// TestPlotBars draws bars on a log axis: each bar's colour fills a height that grows with the log of its value
// (10 is twice as tall as about 3.16 and half as tall as 100 on a 1..100 axis).
func TestPlotBars(t *testing.T) {
	var buf bytes.Buffer
	bars := []Bar{{"a", 100, Palette[0]}, {"b\nsecond", 10, Palette[1]}, {"c", math.Sqrt(10), Palette[2]}}
	if err := PlotBars(&buf, "GPUs needed", "GPUs", bars); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	height := map[int]int{}
	b := img.Bounds()
	for x := b.Min.X; x < b.Max.X; x++ {
		for y := b.Min.Y; y < b.Max.Y; y++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			for i, bar := range bars {
				if c := bar.Color; r>>8 == uint32(c.R) && g>>8 == uint32(c.G) && bl>>8 == uint32(c.B) {
					height[i]++
				}
			}
		}
	}
	// Per-column heights: total pixels / bar width (170).
	h := func(i int) float64 { return float64(height[i]) / 170 }
	if math.Abs(h(0)-2*h(1)) > 2 || math.Abs(h(1)-2*h(2)) > 2 || h(2) < 50 {
		t.Errorf("bar heights %.1f %.1f %.1f, want 2:1 ratios on the log axis", h(0), h(1), h(2))
	}
}
