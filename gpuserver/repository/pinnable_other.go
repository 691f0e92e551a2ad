//go:build !linux

package repository

// pinnableHint has nothing to add off Linux.
func pinnableHint(string) string { return "" }
