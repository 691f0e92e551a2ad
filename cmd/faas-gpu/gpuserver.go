package main

import (
	"context"
	"errors"
	"io"
)

func runGPUServer(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("not implemented yet")
}
