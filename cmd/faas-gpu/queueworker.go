package main

import (
	"context"
	"errors"
	"io"
)

func runQueueWorker(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("not implemented yet")
}
