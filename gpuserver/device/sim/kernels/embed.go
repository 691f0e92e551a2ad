// Package kernels holds the PTX text of faas-gpu's reference kernels (their parameter layouts are documented in
// package sim), so that tests, examples and the GPU suite load the same module on the sim and on a real GPU.
package kernels

import _ "embed"

//go:embed kernels.ptx
var ptxText string

// PTX returns the PTX module with the entries vector_add, matmul, linear, relu, fill, scale and busy.
func PTX() []byte { return []byte(ptxText) }

// Names lists the reference kernels in the order they appear in PTX.
func Names() []string {
	return []string{"vector_add", "matmul", "linear", "relu", "fill", "scale", "busy"}
}
