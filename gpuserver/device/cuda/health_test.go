package cuda_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// TestHealthCheckOnTheFakeDriver: device.CheckHealth runs its calls on the cuda backend without a GPU (the fake
// driver, which does no work): it creates a context, maps memory, sets it and reads it back, and since the fake
// driver never wrote the bytes it answers ErrCheckFailed at the comparison. A check that did not verify the
// device's work would pass here.
func TestHealthCheckOnTheFakeDriver(t *testing.T) {
	b := openFake(t)
	err := device.CheckHealth(context.Background(), b, 0)
	if !errors.Is(err, device.ErrCheckFailed) || !strings.Contains(err.Error(), "compare") {
		t.Fatalf("the health check on a driver that does no work: %v, want ErrCheckFailed at the comparison", err)
	}
	if err := device.CheckHealth(context.Background(), b, 5); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("gpu 5 of 1: %v, want ErrInvalidValue", err)
	}
}

// TestCUDAHealthCheck: on a real GPU (the GPU suite) every GPU passes the check, in a fresh context each time.
func TestCUDAHealthCheck(t *testing.T) {
	b := openCUDA(t)
	for g := range b.GPUs() {
		for i := 0; i < 2; i++ {
			if err := device.CheckHealth(context.Background(), b, g); err != nil {
				t.Fatalf("gpu %d check %d: %v", g, i, err)
			}
		}
	}
}
