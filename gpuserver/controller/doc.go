// Package controller decides where each GPU request runs: which GPU binds it, whether and from where its model is
// swapped in (none, NVLink from another GPU's copy, PCIe from the host image, a cold start), which copies are
// evicted first, which requests wait, are refused or shed, all under one policy (faas-gpu, fcfs, keep-alive,
// static, random; policy.go) and an optional admission rule (admission.go).
//
// # Contract
//
// A Controller is a pure decision core:
//
//   - No clock: every method that depends on time takes now as its first argument, and predicted durations are
//     inputs (the caller reports what it measured: SwapDone's took, Complete's exec). The same inputs give the same
//     decisions, which is what lets the simulator (package simulate) run the product's policy on a virtual clock.
//   - No I/O: it moves no data, opens nothing, starts no goroutine and takes no lock. Its callers serialise it and
//     carry its decisions out.
//
// The decision cycle:
//
//  1. Register (and Deregister) the functions, SetHealthy the GPUs; Evicted tells it of copies the data plane
//     dropped on its own.
//  2. Submit each request as it arrives (Cancel one that gave up).
//  3. Dispatch(now) binds waiting requests to idle GPUs, in the queue's order (package queueing), and returns one
//     Decision per request bound: the evictions to apply, then the swap, then the request runs.
//  4. The caller reports SwapDone once the swap ended and Complete once the request released its GPU; both free
//     capacity, so the caller dispatches again.
//
// Pool (pool.go) is the one driver of the cycle in this package that is not pure: the gpuserver's pool.Pool, it runs
// the Controller on a wall clock (PoolConfig.Now) under its own mutex and carries each Decision out through an
// Actuator (the data plane's swaps and evictions, implemented outside this package; LinkActuator, used when no data
// plane is wired, only waits for the modelled transfer time). The simulator drives the same Controller on its
// virtual clock instead.
package controller
