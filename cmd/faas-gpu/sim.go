package main

import (
	"context"
	"errors"
	"io"
)

func runSim(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("not implemented yet")
}
