package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// scratchCollector exports the bytes of scratch the data plane wrote back to the host and restored, per GPU
// (executor.Status: the scratch functions keep between requests, moved across PCIe at every eviction and move).
// With executor processes per tenant the figures are the running executors' sums, each since it started.
type scratchCollector struct {
	plane       executor.DataPlane
	writtenBack *prometheus.Desc
	restored    *prometheus.Desc
}

func newScratchCollector(plane executor.DataPlane) *scratchCollector {
	gpu := []string{"gpu"}
	return &scratchCollector{plane: plane,
		writtenBack: prometheus.NewDesc("faas_gpu_scratch_written_back_bytes_total",
			"Bytes of scratch (memory functions allocate after their initialisation and keep between requests) "+
				"written back to host memory when a function's copy left the GPU.", gpu, nil),
		restored: prometheus.NewDesc("faas_gpu_scratch_restored_bytes_total",
			"Bytes of scratch copied back into the GPU from host memory at swap-ins.", gpu, nil)}
}

func (c *scratchCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.writtenBack
	ch <- c.restored
}

func (c *scratchCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.plane.Status() {
		gpu := strconv.Itoa(st.GPU)
		ch <- prometheus.MustNewConstMetric(c.writtenBack, prometheus.CounterValue, float64(st.ScratchWrittenBack), gpu)
		ch <- prometheus.MustNewConstMetric(c.restored, prometheus.CounterValue, float64(st.ScratchRestored), gpu)
	}
}
