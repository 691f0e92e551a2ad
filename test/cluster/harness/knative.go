package harness

import (
	"context"
	"errors"
)

// StartKnative starts Knative Serving's controller outside the cluster.
func (c *Cluster) StartKnative(ctx context.Context, bin, queueImage string) (*KnativeInfo, error) {
	return nil, errors.New("knative: not yet")
}
