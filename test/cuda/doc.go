// Package cuda is the "real CUDA binaries" tier of the tests (make test-cuda): NVIDIA's CUDA 13 runtime, nvcc,
// cuBLAS(Lt), cuDNN 9 and PyTorch 2.11.0 from the pinned Python environment (test/pyenv) run unchanged through
// the shim (libcuda.so.1) against a remoting server on a simulated H100 node, in this process. The tests skip
// outside make test-cuda (test/pyenv: FAAS_GPU_TEST_PYENV=1) so that `make test` never needs the multi-GB
// environment.
package cuda
