# syntax=docker/dockerfile:1
# The faas-gpu image: one binary for every component (provider, queue-worker, gpuserver, up) plus the shim
# (the replacement libcuda.so.1) that the provider's init container copies into GPU function pods.
#
#   docker build -t ghcr.io/faas-gpu/faas-gpu:0.1.0 --build-arg IMAGE=ghcr.io/faas-gpu/faas-gpu:0.1.0 \
#     --build-arg VERSION=0.1.0 .
#
# The stock openfaas chart runs `./faas-netes` in the gateway pod: WORKDIR holds a faas-netes link to the binary,
# which then runs the provider with the kubernetes backend.

ARG GO_VERSION=1.26
ARG DEBIAN_VERSION=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# cgo: NVML and the CUDA driver are loaded at run time (dlopen), so no NVIDIA library is needed to build.
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/faas-gpu ./cmd/faas-gpu \
 && make -C shim build/libcuda.so.1 \
 && cp shim/build/libcuda.so.1 /out/libcuda.so.1

FROM debian:${DEBIAN_VERSION}-slim AS ship
# The image's own reference: GPU function pods copy the shim from it (provider flag -shim-image).
ARG IMAGE=ghcr.io/faas-gpu/faas-gpu:latest
RUN groupadd --system --gid 65532 faas-gpu \
 && useradd --system --uid 65532 --gid faas-gpu --home-dir /home/app --create-home faas-gpu
COPY --from=build /out/faas-gpu /usr/local/bin/faas-gpu
COPY --from=build /out/libcuda.so.1 /usr/local/lib/faas-gpu/libcuda.so.1
WORKDIR /home/app
RUN ln -s /usr/local/bin/faas-gpu /home/app/faas-netes
ENV FAAS_GPU_SHIM_IMAGE=${IMAGE} \
    FAAS_GPU_BACKEND=kubernetes
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/faas-gpu"]
CMD ["--help"]
