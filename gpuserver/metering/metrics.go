package metering

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the bill since it began to Prometheus: one series per function of each counter (labels
// function and namespace; sum by namespace for a namespace's bill). They are counters that survive restarts of the
// gpuserver (the state file).
func (m *Meter) Collector() prometheus.Collector {
	labels := []string{"function", "namespace"}
	return collector{m: m,
		gpuSeconds: prometheus.NewDesc("faas_gpu_usage_gpu_seconds_total",
			"GPU seconds held by the function's requests (acquire to release, summed over requests).", labels, nil),
		gpuMemory: prometheus.NewDesc("faas_gpu_usage_gpu_memory_byte_seconds_total",
			"GPU memory quota of the function times the GPU seconds its requests held (byte-seconds).", labels, nil),
		hostMemory: prometheus.NewDesc("faas_gpu_usage_host_memory_byte_seconds_total",
			"Bytes of the function's model image in host memory times the time they were held (byte-seconds).",
			labels, nil),
		requests: prometheus.NewDesc("faas_gpu_usage_requests_total",
			"Requests of the function that held a GPU and released it (metered bindings).", labels, nil),
	}
}

type collector struct {
	m                                           *Meter
	gpuSeconds, gpuMemory, hostMemory, requests *prometheus.Desc
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gpuSeconds, c.gpuMemory, c.hostMemory, c.requests} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.m.Report(time.Time{}).Functions {
		for _, s := range []struct {
			d *prometheus.Desc
			v float64
		}{{c.gpuSeconds, u.GPUSeconds}, {c.gpuMemory, u.GPUMemoryByteSeconds},
			{c.hostMemory, u.HostMemoryByteSeconds}, {c.requests, float64(u.Requests)}} {
			ch <- prometheus.MustNewConstMetric(s.d, prometheus.CounterValue, s.v, u.Function, u.Namespace)
		}
	}
}
