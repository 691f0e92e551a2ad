package gpuspec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		want    pool.FunctionSpec
		isGPU   bool
		wantErr string // substring; the annotation it names
	}{
		{name: "no annotations", ann: nil},
		{name: "unrelated annotations", ann: map[string]string{"topic": "x", "com.openfaas.scale.min": "1"}},
		{
			name:  "memory only gets defaults",
			ann:   map[string]string{contract.AnnotationMemory: "1536Mi"},
			isGPU: true,
			want:  pool.FunctionSpec{Name: "f", MemoryBytes: 1536 << 20, Percentile: 98, Isolation: "shared"},
		},
		{
			name: "everything",
			ann: map[string]string{contract.AnnotationMemory: "2Gi", contract.AnnotationSLO: "80ms", contract.AnnotationPercentile: "99.5",
				contract.AnnotationIsolation: "isolated"},
			isGPU: true,
			want: pool.FunctionSpec{Name: "f", MemoryBytes: 2 << 30, SLO: 80 * time.Millisecond, Percentile: 99.5,
				Isolation: "isolated"},
		},
		{
			name:  "decimal suffix and spaces",
			ann:   map[string]string{contract.AnnotationMemory: " 500M ", contract.AnnotationSLO: " 1.5s"},
			isGPU: true,
			want:  pool.FunctionSpec{Name: "f", MemoryBytes: 500e6, SLO: 1500 * time.Millisecond, Percentile: 98, Isolation: "shared"},
		},
		{
			name:  "scratch of the request",
			ann:   map[string]string{contract.AnnotationMemory: "1536Mi", contract.AnnotationScratch: "request"},
			isGPU: true,
			want: pool.FunctionSpec{Name: "f", MemoryBytes: 1536 << 20, Percentile: 98, Isolation: "shared",
				Scratch: "request"},
		},
		{name: "scratch unknown", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationScratch: "kv"}, wantErr: contract.AnnotationScratch},
		{
			name:  "model shared",
			ann:   map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationModel: "shared"},
			isGPU: true,
			want:  pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 30, Percentile: 98, Isolation: "shared", Model: "shared"},
		},
		{name: "model unknown", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationModel: "public"}, wantErr: contract.AnnotationModel},
		{name: "memory not a quantity", ann: map[string]string{contract.AnnotationMemory: "lots"}, wantErr: contract.AnnotationMemory},
		{name: "memory empty", ann: map[string]string{contract.AnnotationMemory: ""}, wantErr: contract.AnnotationMemory},
		{name: "memory zero", ann: map[string]string{contract.AnnotationMemory: "0Mi"}, wantErr: contract.AnnotationMemory},
		{name: "memory negative", ann: map[string]string{contract.AnnotationMemory: "-1Gi"}, wantErr: contract.AnnotationMemory},
		{name: "memory milli", ann: map[string]string{contract.AnnotationMemory: "500m"}, wantErr: contract.AnnotationMemory},
		{name: "memory bad suffix", ann: map[string]string{contract.AnnotationMemory: "2GB"}, wantErr: contract.AnnotationMemory},
		{name: "memory too large", ann: map[string]string{contract.AnnotationMemory: "100000Ei"}, wantErr: contract.AnnotationMemory},
		{name: "slo without memory", ann: map[string]string{contract.AnnotationSLO: "80ms"}, wantErr: contract.AnnotationMemory},
		{name: "slo not a duration", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationSLO: "80"}, wantErr: contract.AnnotationSLO},
		{name: "slo negative", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationSLO: "-80ms"}, wantErr: contract.AnnotationSLO},
		{name: "percentile not a number", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationPercentile: "high"}, wantErr: contract.AnnotationPercentile},
		{name: "percentile 100", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationPercentile: "100"}, wantErr: contract.AnnotationPercentile},
		{name: "percentile 0", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationPercentile: "0"}, wantErr: contract.AnnotationPercentile},
		{name: "percentile NaN", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationPercentile: "NaN"}, wantErr: contract.AnnotationPercentile},
		{name: "isolation unknown", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationIsolation: "exclusive"}, wantErr: contract.AnnotationIsolation},
		{
			name: "compute shares as fraction and percentage",
			ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeRequest: "0.3",
				contract.AnnotationComputeLimit: " 60% "},
			isGPU: true,
			want: pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 30, Percentile: 98, Isolation: "shared",
				ComputeRequest: 0.3, ComputeLimit: 0.6},
		},
		{
			name:  "compute limit alone",
			ann:   map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeLimit: "0.5"},
			isGPU: true,
			want:  pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 30, Percentile: 98, Isolation: "shared", ComputeLimit: 0.5},
		},
		{name: "compute request not a number", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeRequest: "half"}, wantErr: contract.AnnotationComputeRequest},
		{name: "compute request zero", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeRequest: "0%"}, wantErr: contract.AnnotationComputeRequest},
		{name: "compute request bare 30", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeRequest: "30"}, wantErr: contract.AnnotationComputeRequest},
		{name: "compute limit above one GPU", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeLimit: "120%"}, wantErr: contract.AnnotationComputeLimit},
		{name: "compute request above limit", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeRequest: "0.8", contract.AnnotationComputeLimit: "0.5"}, wantErr: contract.AnnotationComputeRequest},
		{name: "compute request NaN", ann: map[string]string{contract.AnnotationMemory: "1Gi", contract.AnnotationComputeRequest: "NaN"}, wantErr: contract.AnnotationComputeRequest},
		{name: "typo in annotation", ann: map[string]string{contract.AnnotationMemory: "1Gi", "com.openfaas.gpu.mem": "1Gi"}, wantErr: "com.openfaas.gpu.mem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, isGPU, err := Parse(tt.ann, "f")
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse(%v) = %+v, want an error naming %s", tt.ann, got, tt.wantErr)
				}
				if !errors.Is(err, provider.ErrInvalid) {
					t.Errorf("error %v does not wrap provider.ErrInvalid", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not name %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%v): %v", tt.ann, err)
			}
			if isGPU != tt.isGPU || got != tt.want {
				t.Errorf("Parse(%v) = %+v, %v; want %+v, %v", tt.ann, got, isGPU, tt.want, tt.isGPU)
			}
		})
	}
}

func TestParseQuantity(t *testing.T) {
	good := map[string]uint64{
		"1":      1,
		"1536Mi": 1536 << 20,
		"1.5Gi":  1610612736,
		"2Gi":    2 << 30,
		"500M":   500_000_000,
		"1k":     1000,
		"1Ki":    1024,
		"1e9":    1_000_000_000,
		"1E3":    1000,
		"0.5":    1, // rounded up to a whole byte
		"1Ei":    1 << 60,
		"15E":    15_000_000_000_000_000_000,
	}
	for in, want := range good {
		got, err := ParseQuantity(in)
		if err != nil || got != want {
			t.Errorf("ParseQuantity(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Mi", "abc", "1.2.3Gi", "+1Gi", "0x10", "1 Gi", "20E", "1e", "1e1000", "1GB", "1K", "1mi"} {
		if got, err := ParseQuantity(in); err == nil {
			t.Errorf("ParseQuantity(%q) = %d, want an error", in, got)
		}
	}
}

func TestFunctionName(t *testing.T) {
	for _, tt := range []struct{ svc, ns, want string }{
		{"hello-gpu", "", "hello-gpu"},
		{"hello-gpu", provider.DefaultNamespace, "hello-gpu"},
		{"resnet", "team-a", "resnet.team-a"},
	} {
		if got := FunctionName(tt.svc, tt.ns); got != tt.want {
			t.Errorf("FunctionName(%q, %q) = %q, want %q", tt.svc, tt.ns, got, tt.want)
		}
	}
}
