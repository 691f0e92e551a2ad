// Package contract is the function contract: what a function's deployment tells faas-gpu (its annotations), what
// its process is told (its environment), and the defaults that hold where it says nothing. The provider checks a
// deployment against it (provider/gpuspec), the queue worker and the gpuserver act on it, and the gpu-python
// template (template/gpu-python/index.py) and the shim (shim/src) read the environment: they are Python and C, so
// contract_test.go checks that they read exactly the names this package lists.
//
// docs/design.md ("Contracts with the outside world") is the record of why each of these exists.
package contract
