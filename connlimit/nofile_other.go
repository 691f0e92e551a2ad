//go:build !unix

package connlimit

// NoFile is 1024 where the limit cannot be read.
func NoFile() uint64 { return 1024 }
