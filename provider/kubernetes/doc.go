// Package kubernetes runs faas-gpu functions on Kubernetes the way faas-netes does: each function is a Deployment
// and a Service in its namespace, with faas-netes' labels and annotations so that existing tooling keeps working.
// GPU functions (annotation com.openfaas.gpu.memory) request no nvidia.com/gpu: they are pinned to GPU nodes by node
// affinity, get the shim (a replacement libcuda.so.1) copied into the pod by an init container, mount the node's
// gpuserver socket directory, and request host memory covering their model image.
//
// The same package provides the SecretStore, LogSource and namespace listing that the knative backend shares.
package kubernetes
