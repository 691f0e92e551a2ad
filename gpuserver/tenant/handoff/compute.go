package handoff

// KindComputeShares carries compute.Allotment (gpuserver -> executor, answered with compute.Report): the grants of
// a GPU's shared bindings that run in the executor, every period and when one joins or leaves
// (gpuserver/compute's Coordinator; OpComputeShares). Minor version 5.
const KindComputeShares Kind = 48
